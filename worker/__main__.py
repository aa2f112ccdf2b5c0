"""`python -m worker`: see worker/cli.py."""

import sys

from worker.cli import main

sys.exit(main())
