"""The paper's source preference as a function (the oracle of `CorpusSet.pick`)."""

from __future__ import annotations

from typing import Literal

# Where a draft comes from: one name per corpus.
Source = Literal["request", "session", "workspace", "history", "global"]


def choose_source(m_s: int, m_w: int, m_g: int, margin: int, m_h: int = 0) -> Source | None:
    """The paper's preference: global only when it beats both live matches by > margin.

    `m_h` (history, beyond the paper) wins when strictly longer than both live matches.

    >>> choose_source(3, 5, 9, 4), choose_source(3, 5, 10, 4), choose_source(3, 3, 0, 4)
    ('workspace', 'global', 'session')
    >>> choose_source(3, 5, 0, 4, m_h=6), choose_source(3, 5, 0, 4, m_h=5)
    ('history', 'workspace')
    """
    live = max(m_s, m_w)
    if m_g > max(live, m_h) + margin:
        return "global"
    if m_h > live:
        return "history"
    if m_w > m_s:
        return "workspace"
    if m_s > 0:
        return "session"
    return None
