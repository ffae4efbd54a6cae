"""A tiny CSV line parser (no escapes, double quotes only)."""


def parse_line(line: str) -> list[str]:
    """Split one CSV line into its fields."""
    fields = []
    current = ""
    in_quotes = False
    for ch in line:
        if ch == '"':
            in_quotes = not in_quotes
        elif ch == ",":
            fields.append(current)
            current = ""
        else:
            current += ch
    fields.append(current)
    return fields
