"""`python -m worker.cli ...` runs the `chatq` command (what the tests and the Dockerfile call)."""

import sys

from worker.cli.commands import main

sys.exit(main())
