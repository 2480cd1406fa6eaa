import sys

from buildmatrix.cli import main

sys.exit(main())
