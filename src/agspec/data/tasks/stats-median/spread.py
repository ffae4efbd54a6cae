"""Spread of a sample."""

from stats import mean


def variance(values: list[float]) -> float:
    m = mean(values)
    return sum((v - m) ** 2 for v in values) / len(values)


def value_range(values: list[float]) -> float:
    return max(values) - min(values)
