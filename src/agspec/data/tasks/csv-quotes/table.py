"""Read a CSV text into a list of dicts."""

from csvline import parse_line


def read_table(text: str) -> list[dict[str, str]]:
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = parse_line(lines[0])
    return [dict(zip(header, parse_line(line))) for line in lines[1:]]
