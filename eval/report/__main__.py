import sys

from eval.report.writer import main

sys.exit(main())
