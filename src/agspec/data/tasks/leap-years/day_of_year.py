"""Day of the year (1-based)."""

from calendar_utils import days_in_month


def day_of_year(year: int, month: int, day: int) -> int:
    return sum(days_in_month(year, m) for m in range(1, month)) + day
