"""Lists of rows as matrices."""

Matrix = list[list[float]]


def shape(m: Matrix) -> tuple[int, int]:
    return len(m), len(m[0]) if m else 0


def transpose(m: Matrix) -> Matrix:
    rows = len(m)
    return [[m[i][j] for i in range(rows)] for j in range(rows)]
