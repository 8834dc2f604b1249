import sys

from .score import main

if __name__ == "__main__":
    sys.exit(main())
