"""python -m homagg.refswitch"""

import sys

from homagg.refswitch.cli import main

sys.exit(main())
