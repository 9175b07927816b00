"""``python -m benchmarks.gpu``: the GPU measurement kit (`benchmarks.gpu.kit`)."""

import sys

from benchmarks.gpu.kit import main

sys.exit(main())
