"""``python -m vitlarge.run``: the launcher (`vitlarge.run.launch_cli`)."""

import sys

from vitlarge.run.launch_cli import main

sys.exit(main())
