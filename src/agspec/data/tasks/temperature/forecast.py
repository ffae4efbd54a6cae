"""Format a forecast in both units."""

from convert import celsius_to_fahrenheit


def describe(city: str, celsius: float) -> str:
    return f"{city}: {celsius:.0f}C / {celsius_to_fahrenheit(celsius):.0f}F"
