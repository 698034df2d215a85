"""``python -m drivetrain.launch [options] script.py [args]``: the same as ``drivetrain launch``.

Useful to pass interpreter flags to the launcher itself (``python -u -m drivetrain.launch ...``).
"""

from __future__ import annotations

import sys

from drivetrain.commands.launch import main

if __name__ == "__main__":
    sys.exit(main())
