"""A stock item."""

from dataclasses import dataclass


@dataclass
class Item:
    sku: str
    price: float
    quantity: int = 0

    def restock(self, count: int) -> None:
        if count <= 0:
            raise ValueError("count must be positive")
        self.quantity += count
