"""Boolean feature flags from strings."""


def parse_bool(value: str) -> bool:
    if value == "True":
        return True
    if value == "False":
        return False
    raise ValueError(f"not a boolean: {value!r}")
