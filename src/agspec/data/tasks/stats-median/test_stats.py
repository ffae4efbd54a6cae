import unittest

from spread import value_range, variance
from stats import mean, median


class StatsTest(unittest.TestCase):
    def test_mean(self) -> None:
        self.assertEqual(mean([1, 2, 3]), 2)

    def test_median_odd(self) -> None:
        self.assertEqual(median([3, 1, 2]), 2)

    def test_median_even(self) -> None:
        self.assertEqual(median([4, 1, 3, 2]), 2.5)

    def test_spread(self) -> None:
        self.assertEqual(variance([1, 3]), 1)
        self.assertEqual(value_range([5, 1, 9]), 8)


if __name__ == "__main__":
    unittest.main()
