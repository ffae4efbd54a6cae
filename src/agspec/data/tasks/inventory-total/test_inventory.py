import unittest

from inventory import Inventory
from item import Item


class InventoryTest(unittest.TestCase):
    def test_total_uses_quantity(self) -> None:
        inv = Inventory()
        inv.add(Item("widget", 2.5, 3))
        inv.add(Item("gadget", 10.0, 1))
        self.assertAlmostEqual(inv.total_value(), 17.5)

    def test_remove(self) -> None:
        inv = Inventory()
        inv.add(Item("widget", 2.5, 3))
        inv.remove("widget", 2)
        self.assertAlmostEqual(inv.total_value(), 2.5)
        with self.assertRaises(ValueError):
            inv.remove("widget", 5)


if __name__ == "__main__":
    unittest.main()
