import unittest

from slugs import slugify
from textkit import title_slug, truncate


class TruncateTest(unittest.TestCase):
    def test_short_text_unchanged(self) -> None:
        self.assertEqual(truncate("abc", 10), "abc")

    def test_exact_width_unchanged(self) -> None:
        self.assertEqual(truncate("abcdef", 6), "abcdef")

    def test_long_text_has_width(self) -> None:
        self.assertEqual(truncate("abcdefghij", 8), "abcde...")

    def test_slug(self) -> None:
        self.assertEqual(slugify("Hello, World!"), "hello-world")
        self.assertEqual(title_slug("A very long title for a post", 12), "a-very-lo...")


if __name__ == "__main__":
    unittest.main()
