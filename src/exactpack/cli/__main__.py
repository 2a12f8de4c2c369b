"""``python -m exactpack.cli``: the command line."""

import sys

from exactpack.cli import main

sys.exit(main())
