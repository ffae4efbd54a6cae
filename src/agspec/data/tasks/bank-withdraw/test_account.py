import unittest

from account import Account
from errors import InsufficientFunds


class AccountTest(unittest.TestCase):
    def test_withdraw_all(self) -> None:
        acc = Account("ada", 100)
        acc.withdraw(100)
        self.assertEqual(acc.balance, 0)

    def test_overdraft(self) -> None:
        acc = Account("ada", 10)
        with self.assertRaises(InsufficientFunds):
            acc.withdraw(11)

    def test_deposit(self) -> None:
        acc = Account("bob")
        acc.deposit(5)
        self.assertEqual(acc.balance, 5)


if __name__ == "__main__":
    unittest.main()
