"""The test tiers and the guards of tests that need what a plain install lacks.

Markers (registered in pyproject.toml):
- `slow`: more than a few seconds here (a real model, a server process, a fuzz);
  `pytest -m "not slow"` is the quick tier, scripts/test.sh runs everything;
- `engine("name", ...)`: needs an optional engine (a key of guards.ENGINES); skipped
  with the install command when it does not import;
- `server`: starts `agspec serve` and drives it with `openai`; skipped when the serve
  extra, `openai` or llama-cpp-python is missing.
Test files that import an engine at module level call guards.require_engine instead.
"""

from __future__ import annotations

import pytest
from guards import missing_engine, missing_server


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reasons: dict[str, str | None] = {}

    def missing(key: str) -> str | None:
        if key not in reasons:
            reasons[key] = missing_server() if key == "server" else missing_engine(key)
        return reasons[key]

    for item in items:
        needs = [name for m in item.iter_markers("engine") for name in m.args]
        if item.get_closest_marker("server") is not None:
            needs.append("server")
        for key in needs:
            reason = missing(key)
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=reason))
                break
