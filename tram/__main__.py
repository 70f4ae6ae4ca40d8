import sys

from tram.entrypoints.cli import main

if __name__ == "__main__":  # the engine process (spawned) must not run the CLI again
    sys.exit(main())
