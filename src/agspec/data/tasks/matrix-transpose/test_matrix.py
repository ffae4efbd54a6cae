import unittest

from matrix import shape, transpose
from ops import matmul


class MatrixTest(unittest.TestCase):
    def test_square(self) -> None:
        self.assertEqual(transpose([[1, 2], [3, 4]]), [[1, 3], [2, 4]])

    def test_rectangular(self) -> None:
        self.assertEqual(transpose([[1, 2, 3], [4, 5, 6]]), [[1, 4], [2, 5], [3, 6]])

    def test_matmul(self) -> None:
        self.assertEqual(matmul([[1, 2, 3]], [[1], [1], [1]]), [[6]])
        self.assertEqual(shape([[1, 2, 3]]), (1, 3))


if __name__ == "__main__":
    unittest.main()
