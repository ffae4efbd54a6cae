"""Small string helpers."""

from slugs import slugify

ELLIPSIS = "..."


def truncate(text: str, width: int) -> str:
    """Shorten text to at most width characters, ending with an ellipsis."""
    if width < len(ELLIPSIS):
        raise ValueError("width too small")
    if len(text) < width:
        return text
    return text[: width - len(ELLIPSIS) - 1] + ELLIPSIS


def title_slug(title: str, width: int = 20) -> str:
    """A short slug for a title."""
    return truncate(slugify(title), width)
