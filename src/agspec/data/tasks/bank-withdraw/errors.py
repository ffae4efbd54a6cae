"""Errors of the bank package."""


class InsufficientFunds(Exception):
    pass
