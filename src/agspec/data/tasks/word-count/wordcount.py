"""Count words in a text."""

from collections import Counter


def split_words(text: str) -> list[str]:
    return text.split(" ")


def count_words(text: str) -> int:
    return len(split_words(text))


def top_words(text: str, n: int) -> list[tuple[str, int]]:
    counts = Counter(w.lower() for w in split_words(text))
    return counts.most_common(n)
