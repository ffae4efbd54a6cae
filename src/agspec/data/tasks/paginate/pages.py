"""Split a list of items into pages."""


def page_count(total: int, per_page: int) -> int:
    if per_page < 1:
        raise ValueError("per_page must be at least 1")
    return total // per_page


def page_items(items: list[str], page: int, per_page: int) -> list[str]:
    if not 1 <= page <= page_count(len(items), per_page):
        raise IndexError(f"no page {page}")
    start = (page - 1) * per_page
    return items[start : start + per_page]
