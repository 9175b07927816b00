"""``python -m benchmarks.gpu``: the GPU measurement kit (`benchmarks.gpu.kit`)."""

from benchmarks.gpu.kit import main
from vitlarge.distributed.launch import main_then_leave

main_then_leave(main)  # its process group of one is up to the end: leave as train.py does
