import unittest

from links import page_links
from pages import page_count, page_items


class PagesTest(unittest.TestCase):
    def test_counts(self) -> None:
        self.assertEqual(page_count(20, 10), 2)
        self.assertEqual(page_count(25, 10), 3)
        self.assertEqual(page_count(0, 10), 0)

    def test_last_page(self) -> None:
        items = [str(i) for i in range(25)]
        self.assertEqual(page_items(items, 3, 10), ["20", "21", "22", "23", "24"])

    def test_links(self) -> None:
        self.assertEqual(page_links(11, 10), ["/page/1", "/page/2"])


if __name__ == "__main__":
    unittest.main()
