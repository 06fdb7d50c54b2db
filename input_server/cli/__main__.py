"""`python -m input_server.cli ARGS`: the `input-server` command without its entry point."""

import sys

from input_server.cli import main

sys.exit(main())
