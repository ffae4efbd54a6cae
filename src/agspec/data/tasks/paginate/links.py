"""Page links for a navigation bar."""

from pages import page_count


def page_links(total: int, per_page: int) -> list[str]:
    return [f"/page/{n}" for n in range(1, page_count(total, per_page) + 1)]
