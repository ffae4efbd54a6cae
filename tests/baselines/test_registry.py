"""Every baseline family by name: the DrafterServer shape, one end-to-end call each, and a
clear error for unknown names and missing engines."""

from __future__ import annotations

import importlib.util
import sys

import pytest

pytest.importorskip("agspec._native", reason="native index not built (pip install -e .)")

from agspec.baselines.registry import BASELINES, make_family  # noqa: E402
from agspec.drafter.protocol import CallDrafter, DrafterServer, DrafterSession  # noqa: E402

HAS_ARCTIC = importlib.util.find_spec("arctic_inference") is not None
REQUIRED = {"pld-hf", "pld-vllm", "rest", "sam-fixed", "sam-scaled", "suffix-64", "suffix-24"}


class Ints:
    def encode(self, text: str) -> list[int]:
        return [int(t) for t in text.split()]


def test_every_required_name_is_registered() -> None:
    assert REQUIRED | {"fastcoder"} <= set(BASELINES.names())


# Each family, the same task: a prompt that repeats "1 2 3 4 5 6 7" and a global corpus
# holding it too; every family drafts 8 (what follows the repeated phrase) first.
PHRASE = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]


@pytest.mark.parametrize("name", BASELINES.names())
def test_family_drafts_the_obvious_continuation(name: str) -> None:
    if name.startswith("suffix") and not HAS_ARCTIC:
        pytest.skip("arctic-inference 0.3.0 is not installed (pip install 'agspec[suffix]')")
    server = make_family(name, global_docs=[PHRASE, [0, 0]], tokenizer=Ints(), batch_size=16)
    assert isinstance(server, DrafterServer)
    assert server.name == name
    session = server.session("s", emission_format="unified_diff")
    assert isinstance(session, DrafterSession)
    session.open_artifact("f.py", " ".join(map(str, PHRASE)))
    call = session.call("coder", "code", 0)
    assert isinstance(call, CallDrafter)
    call.begin(PHRASE + [0, 1, 2, 3, 4, 5, 6, 7])
    draft = call.propose(2)
    assert draft and draft[0] == 8, draft
    call.accept([8, 9, 11])
    call.end()
    session.end()


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="sam-fixed"):
        make_family("eagle")


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        make_family("rest", batch_size=0)
    with pytest.raises(TypeError, match="encode"):
        make_family("fastcoder", tokenizer=object())
    with pytest.raises(TypeError, match="global_docs"):
        make_family("rest", global_docs="1 2 3")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="token ids"):
        make_family("sam-fixed", global_docs=[[1, -5]])


def test_missing_engine_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding._C", None)
    with pytest.raises(ImportError, match=r"agspec\[suffix\]"):
        make_family("suffix-64")
