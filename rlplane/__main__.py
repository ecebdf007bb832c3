import sys

from rlplane.cli import main

sys.exit(main())
