import sys

from lmrl.cli import main

sys.exit(main())
