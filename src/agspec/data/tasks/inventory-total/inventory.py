"""An inventory of items by SKU."""

from item import Item


class Inventory:
    def __init__(self) -> None:
        self.items: dict[str, Item] = {}

    def add(self, item: Item) -> None:
        if item.sku in self.items:
            self.items[item.sku].restock(item.quantity)
        else:
            self.items[item.sku] = item

    def remove(self, sku: str, count: int) -> None:
        item = self.items[sku]
        if count > item.quantity:
            raise ValueError(f"only {item.quantity} of {sku} in stock")
        item.quantity -= count

    def total_value(self) -> float:
        return sum(item.price for item in self.items.values())
