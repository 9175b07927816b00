"""``python -m vitlarge.run``: the launcher (`vitlarge.run.supervisor`)."""

import sys

from vitlarge.run.supervisor import main

sys.exit(main())
