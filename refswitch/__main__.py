"""python -m refswitch"""

import sys

from refswitch.cli import main

sys.exit(main())
