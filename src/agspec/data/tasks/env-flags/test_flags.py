import unittest

from flags import parse_bool
from settings import feature_enabled


class FlagsTest(unittest.TestCase):
    def test_words(self) -> None:
        self.assertTrue(parse_bool("yes"))
        self.assertTrue(parse_bool(" ON "))
        self.assertFalse(parse_bool("off"))
        self.assertFalse(parse_bool("0"))

    def test_invalid(self) -> None:
        with self.assertRaises(ValueError):
            parse_bool("maybe")

    def test_env(self) -> None:
        self.assertTrue(feature_enabled({"X": "1"}, "X"))
        self.assertFalse(feature_enabled({}, "X"))


if __name__ == "__main__":
    unittest.main()
