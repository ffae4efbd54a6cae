import unittest

from csvline import parse_line
from table import read_table


class ParseLineTest(unittest.TestCase):
    def test_plain(self) -> None:
        self.assertEqual(parse_line("a,b,c"), ["a", "b", "c"])

    def test_quoted_comma(self) -> None:
        self.assertEqual(parse_line('a,"b,c",d'), ["a", "b,c", "d"])

    def test_table(self) -> None:
        rows = read_table('name,city\nAda,"London, UK"\n')
        self.assertEqual(rows, [{"name": "Ada", "city": "London, UK"}])


if __name__ == "__main__":
    unittest.main()
