"""Matrix products."""

from matrix import Matrix, transpose


def matmul(a: Matrix, b: Matrix) -> Matrix:
    cols = transpose(b)
    return [[sum(x * y for x, y in zip(row, col)) for col in cols] for row in a]
