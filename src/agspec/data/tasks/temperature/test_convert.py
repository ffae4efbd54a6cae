import unittest

from convert import celsius_to_fahrenheit, celsius_to_kelvin, fahrenheit_to_celsius
from forecast import describe


class ConvertTest(unittest.TestCase):
    def test_to_fahrenheit(self) -> None:
        self.assertAlmostEqual(celsius_to_fahrenheit(100), 212)
        self.assertAlmostEqual(celsius_to_fahrenheit(0), 32)

    def test_back(self) -> None:
        self.assertAlmostEqual(fahrenheit_to_celsius(212), 100)
        self.assertAlmostEqual(celsius_to_kelvin(0), 273.15)

    def test_describe(self) -> None:
        self.assertEqual(describe("Oslo", 20), "Oslo: 20C / 68F")


if __name__ == "__main__":
    unittest.main()
