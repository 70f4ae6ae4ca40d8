import sys

from tram.entrypoints.cli import main

sys.exit(main())
