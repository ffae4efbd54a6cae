import unittest

from lru import LRUCache
from memo import memoize


class LRUTest(unittest.TestCase):
    def test_evicts_least_recent(self) -> None:
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        cache.get("a")
        cache.put("c", 3)
        self.assertEqual(cache.get("a"), 1)
        self.assertIsNone(cache.get("b"))
        self.assertEqual(cache.get("c"), 3)

    def test_memoize(self) -> None:
        calls: list[str] = []

        def length(key: str) -> int:
            calls.append(key)
            return len(key)

        f = memoize(length)
        self.assertEqual(f("abc"), 3)
        self.assertEqual(f("abc"), 3)
        self.assertEqual(calls, ["abc"])


if __name__ == "__main__":
    unittest.main()
