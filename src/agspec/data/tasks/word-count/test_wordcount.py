import unittest

from report import report
from wordcount import count_words, top_words


class WordCountTest(unittest.TestCase):
    def test_single_spaces(self) -> None:
        self.assertEqual(count_words("the cat sat"), 3)

    def test_whitespace_runs(self) -> None:
        self.assertEqual(count_words("a   b\tc\nd "), 4)

    def test_top_and_report(self) -> None:
        self.assertEqual(top_words("b a  b", 1), [("b", 2)])
        self.assertEqual(report("x y x"), "3 words; most common: x, y")


if __name__ == "__main__":
    unittest.main()
