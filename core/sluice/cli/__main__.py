"""``python -m sluice.cli``: the ``sluice`` command."""

import sys

from sluice.cli import main

if __name__ == "__main__":
    sys.exit(main())
