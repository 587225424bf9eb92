"""``python -m prism.emulate``: the emulate stage (see `prism.emulate.stage`)."""

import sys

from prism.emulate.stage import main

if __name__ == "__main__":
    sys.exit(main())
