"""The bundle's entry script: app/__main__.py uses relative imports, so it cannot be the script itself.

A frozen app's ``sys.executable`` is the app, so the engine's model probe (engine/llama/probe.py) runs
as ``<app> --engine-probe PATH --ctx N --threads N``: handled first, before anything imports Qt.
"""

import sys

if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--engine-probe":
    from engine.decoding.load_check import main as probe_main

    sys.exit(probe_main(sys.argv[2:]))

from app.__main__ import main  # noqa: E402 (after the probe's early exit: the probe must not load Qt)

if __name__ == "__main__":
    sys.exit(main())
