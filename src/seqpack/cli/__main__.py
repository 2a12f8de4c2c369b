"""``python -m seqpack.cli``: the command line."""

import sys

from seqpack.cli import main

sys.exit(main())
