"""A one-line report about a text."""

from wordcount import count_words, top_words


def report(text: str) -> str:
    top = ", ".join(word for word, _ in top_words(text, 2))
    return f"{count_words(text)} words; most common: {top}"
