"""``python -m prism.calibrate``: the calibrate stage (see `prism.calibrate.stage`)."""

import sys

from prism.calibrate.stage import main

if __name__ == "__main__":
    sys.exit(main())
