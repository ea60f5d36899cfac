"""``python -m engine``: see engine/tools/cli.py."""

import sys

from engine.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
