"""Optimizers: LAMB with its parameter groups (`lamb`) and its sharded version for fsdp (`sharded_lamb`)."""
