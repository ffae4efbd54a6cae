"""Role inference for single-agent scaffolds: what a call does, read off its action.

The rule (documented in `docs/traces-importers.md`), applied to the command the call emitted:

1. SWE-agent interface commands by name: `find_file`, `search_dir`, `search_file`,
   `open`, `goto`, `scroll_up`, `scroll_down` -> localize; `edit`, `create` -> code;
   `submit`, `exit_*` -> other.
2. Otherwise the action is a shell command; its first matching class, in this order:
   - other: the scaffold's submit signal (`submit`, `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`);
   - code: it writes a file: `sed -i`, a heredoc or `cat >` into a file, `tee`, `patch`,
     `git apply`, `git checkout --`, `mv`, `cp`, `touch`, `rm`, `mkdir`;
   - execute: it runs something: `python`, `pytest`, `javac`, `java`, `mvn`, `gradle`,
     `make`, `npm`, `node`, `go`, `cargo`, `tox`, `bash`/`sh` scripts, `./x`, `pip`;
   - localize: it reads or searches: `cat`, `nl`, `sed -n`, `head`, `tail`, `grep`, `rg`,
     `find`, `ls`, `tree`, `wc`, `cd`, `pwd`, `git log|show|grep|diff|status`;
   - other: anything else, and an empty action.

>>> infer_role("search_dir LocalTime")
'localize'
>>> infer_role("cat <<'EOF' > repro.py\\nprint(1)\\nEOF\\npython repro.py")
'code'
>>> infer_role("cd /repo && python -m pytest tests/test_x.py")
'execute'
"""

from __future__ import annotations

import re

__all__ = ["infer_role", "chatdev_phase_role"]

_SWE_COMMANDS = {
    "find_file": "localize",
    "search_dir": "localize",
    "search_file": "localize",
    "open": "localize",
    "goto": "localize",
    "scroll_up": "localize",
    "scroll_down": "localize",
    "edit": "code",
    "create": "code",
    "submit": "other",
    "exit_cost": "other",
    "exit_context": "other",
    "exit_error": "other",
    "exit_format": "other",
    "exit_api": "other",
}

_SUBMIT = re.compile(r"(?m)^\s*(submit\s*$|echo\s+COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT)")
_WRITE = re.compile(
    # Every repeat is bounded by a character it cannot cross: linear time on any input.
    r"\bsed\s+(-[a-zA-Z]*\s+)*-i|<<-?\s*['\"]?\w+['\"]?\s*>|>\s*[^\s<>]+\s*<<"
    r"|\bcat\s*>>?\s*\S|\btee\b|(^|[;&|(]\s*)(patch|mv|cp|touch|rm|mkdir)\b"
    r"|\bgit\s+(apply|checkout\s+--)|\.write_text\(|open\([^()]*['\"][wa]['\"]",
    re.M,
)
_EXEC_WORDS = frozenset(
    "python python3 python2 pytest py.test javac java mvn mvnw gradle gradlew make npm npx "
    "node yarn go cargo tox bash sh pip pip3 ruby perl php rustc gcc g++ clang ant sbt".split()
)
_READ_WORDS = frozenset(
    "cat nl sed head tail grep egrep rg ag find ls tree wc cd pwd less more file stat "
    "awk diff".split()
)
_GIT_READ = frozenset("log show grep diff status blame".split())
_SEGMENT = re.compile(r"&&|\|\||[;|\n]")


def infer_role(action: str) -> str:
    """Role of a call from the action (command) it emitted; see the module docstring."""
    text = action.strip()
    # Leading comment lines say nothing about what runs.
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        return "other"
    first = lines[0].split()[0]
    if first in _SWE_COMMANDS:
        return _SWE_COMMANDS[first]
    body = "\n".join(lines)
    if _SUBMIT.search(body):
        return "other"
    if _WRITE.search(body):
        return "code"
    words = [_command_word(seg) for seg in _SEGMENT.split(body)]
    words = [w for w in words if w]
    if any(_is_exec(w) for w in words):
        return "execute"
    git_read = re.search(r"\bgit\s+(\w+)", body)
    if any(w in _READ_WORDS for w in words) or (git_read and git_read.group(1) in _GIT_READ):
        return "localize"
    return "other"


def _command_word(segment: str) -> str:
    """The program a shell segment runs, skipping `VAR=value` prefixes and `timeout N`."""
    toks = segment.split()
    i = 0
    while i < len(toks) and ("=" in toks[i] and not toks[i].startswith("-")):
        i += 1
    if i < len(toks) and toks[i] in ("timeout", "time", "env", "sudo"):
        i += 1
        while i < len(toks) and (toks[i][:1].isdigit() or toks[i].startswith("-")):
            i += 1
    return toks[i] if i < len(toks) else ""


def _is_exec(word: str) -> bool:
    base = word.rsplit("/", 1)[-1]
    if base in _EXEC_WORDS:
        return True
    # ./runtests.py, ./gradlew, tests/runtests.py: running a script by path.
    return "/" in word and (word.endswith(".py") or word.endswith(".sh") or word.startswith("./"))


# ChatDev 1.0 phases -> roles. A phase's calls share its role, whichever agent speaks.
_CHATDEV_PHASES = {
    "DemandAnalysis": "plan",
    "LanguageChoose": "plan",
    "Reflection": "plan",
    "Coding": "code",
    "CodeComplete": "code",
    "CodeReviewModification": "code",
    "TestModification": "code",
    "CodeReviewComment": "review",
    "CodeReviewHuman": "review",
    "TestErrorSummary": "review",
    "EnvironmentDoc": "other",
    "Manual": "other",
}


def chatdev_phase_role(phase: str) -> str:
    """Role of a ChatDev 1.0 phase: `chatdev_phase_role("CodeReviewComment")` -> `"review"`."""
    return _CHATDEV_PHASES.get(phase, "other")
