import sys

from agspec.cli import main

sys.exit(main())
