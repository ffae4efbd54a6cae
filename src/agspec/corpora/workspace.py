"""The workspace corpus: the files a session opened, in full and in the forms the agent emits."""

from __future__ import annotations

from collections.abc import Callable

from agspec.corpora.forms import emission_forms
from agspec.index.engines import IndexFactory
from agspec.index.token_index import TokenIndex


class WorkspaceCorpus:
    """The artifacts the session opened, each indexed once, in the forms the agent emits."""

    def __init__(
        self,
        encode: Callable[[str], list[int]],
        emission_format: str,
        *,
        with_emission_forms: bool = True,
        index_factory: IndexFactory = TokenIndex,
    ) -> None:
        emission_forms("", emission_format)  # validates the format name up front
        self.index = index_factory()
        self._encode = encode
        self.emission_format = emission_format
        self.with_emission_forms = with_emission_forms
        self._versions: dict[str, set[int]] = {}
        self._lines: dict[str, set[str]] = {}
        self._next_doc = 0

    def open_artifact(self, path: str, text: str) -> int:
        """Indexes what this artifact shows that was not indexed yet; returns tokens added.

        The first view of a path is indexed whole. A later, different view of the same
        path (an agent scrolling through a file, or the file after an edit) adds only its
        runs of lines not seen in earlier views of that path: blank and very short lines
        ("}", "") never split a run. Each run is indexed in every emission form.
        """
        if not isinstance(path, str) or not path:
            raise ValueError("artifact path must be a non-empty str")
        if not isinstance(text, str):
            raise TypeError(
                f"artifact {path!r}: text must be str, got {type(text).__name__} "
                "(decode binary files before opening them, or skip them)"
            )
        if "\x00" in text:
            raise ValueError(f"artifact {path!r} holds NUL bytes: not a text file")
        key = hash(text)
        seen = self._versions.setdefault(path, set())
        if key in seen:
            return 0
        seen.add(key)
        lines = text.splitlines(keepends=True)
        known = self._lines.setdefault(path, set())
        runs = [text] if not known else _new_runs(lines, known)
        known.update(lines)
        added = 0
        for run in runs:
            forms = emission_forms(run, self.emission_format) if self.with_emission_forms else [run]
            for form in forms:
                toks = self._encode(form)
                if toks:
                    # The tokenizer's list goes in as it is (the index checks the ids;
                    # a numpy round trip costs more than the check).
                    self.index.extend_list(
                        self._next_doc, toks if type(toks) is list else list(toks)
                    )
                    self._next_doc += 1
                    added += len(toks)
        return added

    @property
    def num_tokens(self) -> int:
        return self.index.num_tokens

    @property
    def paths(self) -> list[str]:
        return sorted(self._versions)


def _new_runs(lines: list[str], known: set[str]) -> list[str]:
    """Maximal runs of lines not in `known`; short lines never split a run.

    >>> _new_runs(["a = 1\\n", "b = 2\\n", "\\n", "c = 3\\n", "a = 1\\n"], {"a = 1\\n", "\\n"})
    ['b = 2\\n\\nc = 3\\n']
    """
    runs: list[str] = []
    cur: list[str] = []
    for line in lines:
        if line in known and len(line.strip()) >= 4:
            if any(len(x.strip()) >= 4 for x in cur):
                runs.append("".join(cur))
            cur = []
        else:
            cur.append(line)
    if any(len(x.strip()) >= 4 for x in cur):
        runs.append("".join(cur))
    return runs
