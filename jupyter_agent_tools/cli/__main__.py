"""``python -m jupyter_agent_tools.cli``: the same as ``jupyter agent``."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
