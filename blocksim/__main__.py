"""`python -m blocksim`: the `blocksim` command."""

import sys

from blocksim.cli import main

sys.exit(main())
