"""`python -m homagg.worker`: see homagg/worker/cli.py."""

import sys

from homagg.worker.cli import main

sys.exit(main())
