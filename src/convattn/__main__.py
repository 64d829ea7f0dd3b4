import sys

from convattn.cli import main

sys.exit(main())
