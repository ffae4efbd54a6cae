"""Read feature flags from an environment mapping."""

from flags import parse_bool


def feature_enabled(env: dict[str, str], name: str, default: bool = False) -> bool:
    raw = env.get(name)
    if raw is None:
        return default
    return parse_bool(raw)
