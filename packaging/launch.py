"""The bundle's entry script: app/__main__.py uses relative imports, so it cannot be the script itself."""

import sys

from app.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
