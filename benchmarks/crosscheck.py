"""The replay lab against the independent cross-check (agspec.lab.crosscheck).

python benchmarks/crosscheck.py ../shared/data/traces -o runs/crosscheck
"""

import sys

from agspec.lab.crosscheck import main

if __name__ == "__main__":
    sys.exit(main())
