import sys

from prism.report.stage import main

sys.exit(main())
