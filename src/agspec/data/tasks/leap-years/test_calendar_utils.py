import unittest

from calendar_utils import days_in_month, is_leap_year
from day_of_year import day_of_year


class LeapTest(unittest.TestCase):
    def test_leap(self) -> None:
        self.assertTrue(is_leap_year(2024))
        self.assertTrue(is_leap_year(2000))
        self.assertFalse(is_leap_year(2023))

    def test_century(self) -> None:
        self.assertFalse(is_leap_year(1900))
        self.assertEqual(days_in_month(1900, 2), 28)

    def test_day_of_year(self) -> None:
        self.assertEqual(day_of_year(2024, 3, 1), 61)


if __name__ == "__main__":
    unittest.main()
