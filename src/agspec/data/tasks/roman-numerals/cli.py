"""Print Roman numerals for the numbers given on the command line."""

import sys

from roman import to_roman


def main(argv: list[str]) -> int:
    for arg in argv:
        print(to_roman(int(arg)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
