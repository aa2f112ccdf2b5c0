"""`python -m homagg.control` is `aggctl`."""

import sys

from homagg.control.cli import main

sys.exit(main())
