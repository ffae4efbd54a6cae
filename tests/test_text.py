"""The one rule for lone surrogates (`agspec._text`), against a brute-force oracle, and
where it is applied: request bodies (a 400 naming the field) and trace files (the same
message from `check_file` and every reader)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agspec._text import find_lone_surrogate, lone_surrogate


def brute_force(text: str) -> int | None:
    # A lone surrogate is a code point in U+D800..U+DFFF: Python keeps a valid pair
    # written as escapes as one astral character, so every surrogate left is lone.
    for i, ch in enumerate(text):
        if 0xD800 <= ord(ch) <= 0xDFFF:
            return i
    return None


text_with_surrogates = st.text(
    alphabet=st.one_of(st.characters(), st.sampled_from(["\ud800", "\udfff", "\udc00", "é"])),
    max_size=40,
)


@given(text_with_surrogates)
@settings(max_examples=300, deadline=None)
def test_lone_surrogate_matches_brute_force(text: str) -> None:
    assert lone_surrogate(text) == brute_force(text)


def test_a_pair_written_as_escapes_is_one_character() -> None:
    assert lone_surrogate(json.loads('"\\ud83d\\ude00"')) is None
    assert lone_surrogate(json.loads('"\\ude00\\ud83d"')) == 0


@given(st.recursive(
    st.one_of(st.none(), st.integers(), text_with_surrogates),
    lambda kids: st.one_of(st.lists(kids, max_size=4),
                           st.dictionaries(text_with_surrogates, kids, max_size=4)),
    max_leaves=20,
))  # fmt: skip
@settings(max_examples=200, deadline=None)
def test_find_reports_a_bad_string_or_key_iff_one_exists(value) -> None:
    def any_bad(v) -> bool:
        if isinstance(v, str):
            return brute_force(v) is not None
        if isinstance(v, list):
            return any(any_bad(x) for x in v)
        if isinstance(v, dict):
            return any(any_bad(k) or any_bad(x) for k, x in v.items())
        return False

    found = find_lone_surrogate(value)
    assert (found is not None) == any_bad(value)


def test_find_names_the_path_and_survives_deep_nesting() -> None:
    body = {"a": [1, {"b": "ok"}, {"c": ["x", "y\udc01"]}]}
    assert find_lone_surrogate(body) == ("a[2].c[1]", 1)
    deep: list = ["\ud800"]
    for _ in range(50_000):
        deep = [deep]
    assert find_lone_surrogate(deep) == ("[0]" * 50_000 + "[0]", 0)


serve_schema = pytest.importorskip("agspec.serve.schema")


@pytest.mark.parametrize(
    "body,param",
    [
        ({"messages": [{"role": "user", "content": "a\ud800b"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]},
         "messages[0].content[0].text"),
        ({"messages": [{"role": "user", "content": "x"}], "stop": ["ok", "\ud800"]}, "stop[1]"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",
          "function": {"name": "f", "description": "\ud801"}}]},
         "tools[0].function.description"),
        ({"messages": [{"role": "user", "content": "x"}], "user": "\udc00"}, "user"),
    ],
)  # fmt: skip
def test_chat_bodies_with_a_lone_surrogate_get_a_400_naming_the_field(body, param) -> None:
    with pytest.raises(serve_schema.APIError) as info:
        serve_schema.parse_chat(body)
    assert info.value.status == 400 and info.value.param == param
    assert "surrogate" in info.value.message and info.value.message.startswith(param)


def test_completion_prompt_with_a_lone_surrogate_gets_a_400() -> None:
    with pytest.raises(serve_schema.APIError) as info:
        serve_schema.parse_completion({"prompt": ["a\ud800"]})
    assert info.value.param == "prompt[0]"


def _trace_line(content: str) -> str:
    session = {
        "format_version": 1, "session_id": "s1", "source": "swe-agent", "model": "m",
        "task_id": "t", "calls": [{
            "agent": "a", "role": "code", "turn": 0, "emission_format": "none",
            "messages": [{"role": "user", "content": content}], "output": "out",
            "artifacts": [],
        }],
    }  # fmt: skip
    return json.dumps(session)  # ensure_ascii: the surrogate is written as \udXXX


@pytest.mark.parametrize("gz", [False, True])
def test_trace_check_and_every_reader_refuse_the_same_line(tmp_path: Path, gz: bool) -> None:
    from agspec.traces.io import check_file, read_sessions
    from agspec.traces.schema import TraceFormatError
    from agspec.traces.stats import TraceStats

    text = _trace_line("ok") + "\n" + _trace_line("a\ud800b").replace('"s1"', '"s2"') + "\n"
    path = tmp_path / ("t.jsonl.gz" if gz else "t.jsonl")
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    n_ok, errors = check_file(path)
    assert n_ok == 1 and len(errors) == 1
    assert errors[0] == (
        f"{path}:2: session.calls[0].messages[0].content: holds a lone UTF-16 surrogate at "
        "character 1 (an escape such as \\ud800 without its pair); text must be valid Unicode"
    )
    with pytest.raises(TraceFormatError) as info:
        list(read_sessions(path))
    assert str(info.value) == errors[0]
    with pytest.raises(TraceFormatError) as info:
        TraceStats.of(read_sessions(path))
    assert str(info.value) == errors[0]


def test_importers_refuse_a_raw_file_with_a_lone_surrogate(tmp_path: Path) -> None:
    from agspec.traces._util import load_json
    from agspec.traces.schema import TraceFormatError

    with pytest.raises(TraceFormatError, match=r"raw\.json: messages\[0\]\.content: holds"):
        load_json(b'{"messages": [{"content": "\\ud800"}]}', "raw.json")
