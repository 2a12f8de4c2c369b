import sys

from seqpack.cli import main

sys.exit(main())
