import sys

from exactpack.cli import main

sys.exit(main())
