"""Temperature conversions."""


def celsius_to_fahrenheit(celsius: float) -> float:
    return (celsius + 32) * 9 / 5


def fahrenheit_to_celsius(fahrenheit: float) -> float:
    return (fahrenheit - 32) * 5 / 9


def celsius_to_kelvin(celsius: float) -> float:
    if celsius < -273.15:
        raise ValueError("below absolute zero")
    return celsius + 273.15
