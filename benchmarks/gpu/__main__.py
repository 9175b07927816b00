"""``python -m benchmarks.gpu``: the GPU measurement kit (`benchmarks.gpu.kit`)."""

from vitlarge.train.memory import configure_allocator

configure_allocator()  # before torch loads, as train.py does: the kit measures train.py's allocator

from benchmarks.gpu.kit import main  # noqa: E402
from vitlarge.distributed.process import main_then_leave  # noqa: E402

main_then_leave(main)  # its process group of one is up to the end: leave as train.py does
