"""``python -m loopwatch.cli``."""

import sys

from . import main

sys.exit(main())
