"""``python -m rtserve ...``: the same command as ``rtserve ...``."""

import sys

from rtserve.cli import main

sys.exit(main())
