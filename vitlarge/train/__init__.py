"""The training loop: building a run's parts (`assemble`), device settings (`settings`), one optimizer step (`engine`), the loop (`trainer`), evaluation (`evaluation`) and GPU memory (`memory`)."""
