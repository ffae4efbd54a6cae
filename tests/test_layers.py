"""Imports never run upward: every `import` in src/agspec, read with `ast`, goes to its
own layer or one below it, in the order of docs/design.md.

The layers, lowest first (a module may import from its own layer and any layer before
it in LAYERS): the package's base modules (`agspec`, `_files`, `_registry`, `_native`,
`tokenizers`, `models`); the trace format (`traces`, which every layer above may read);
the native index; the corpora; retrieval and policy; the drafter; the baselines; the
adapters (the only code that knows an engine); `agspec serve`; the replay lab; the
recorded pipeline; the CLI. Imports inside functions count as much as top-level ones.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "agspec"
LAYERS = [
    "base",
    "traces",
    "index",
    "corpora",
    "policy",
    "drafter",
    "baselines",
    "adapters",
    "serve",
    "lab",
    "pipeline",
    "cli",
]
RANK = {name: i for i, name in enumerate(LAYERS)}


def layer_of(module: str) -> str:
    """`agspec.drafter.batch` -> `drafter`; the package's own modules -> `base`
    (`__main__`, which runs the CLI, -> `cli`)."""
    parts = module.split(".")
    if len(parts) < 2 or not (PACKAGE / parts[1]).is_dir():
        return "cli" if parts[-1] == "__main__" else "base"
    return parts[1]


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(module: str, source: str, *, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module) of every agspec import in `source`, the text of `module`
    (relative imports resolved; `is_package`: the text of its `__init__.py`)."""
    package = module if is_package else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            # `from agspec import x` imports the module agspec.x when there is one.
            if target == "agspec":
                out += [(node.lineno, f"agspec.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, target))
    return [(line, m) for line, m in out if m == "agspec" or m.startswith("agspec.")]


def upward_in(module: str, source: str, *, is_package: bool = False) -> list[str]:
    """`line: <layer> imports <module> (<its layer>)` for each upward import of `source`."""
    here = layer_of(module)
    return [
        f"{line}: {here} imports {target} ({layer_of(target)})"
        for line, target in imports_of(module, source, is_package=is_package)
        if RANK[layer_of(target)] > RANK[here]
    ]


def upward_imports() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "data" in path.relative_to(PACKAGE).parts:  # bundled task repos, not the package
            continue
        source = path.read_text(encoding="utf-8")
        for f in upward_in(module_name(path), source, is_package=path.name == "__init__.py"):
            found.append(f"{path.relative_to(PACKAGE.parent)}:{f}")
    return found


def test_every_folder_of_the_package_has_a_layer() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert folders <= set(LAYERS), f"folders without a layer: {sorted(folders - set(LAYERS))}"


def test_no_import_runs_upward() -> None:
    found = upward_imports()
    assert not found, "imports that run upward (docs/design.md):\n" + "\n".join(found)


def test_the_checker_sees_an_upward_import() -> None:
    """The oracle for the checker itself: in a made-up drafter module, an import of the lab
    and a relative import of the CLI are found, a downward one and its own layer's not."""
    src = "import agspec.lab.run\nfrom ..cli import main\nfrom agspec.policy import length\n"
    src += "from . import batch\nfrom agspec import _files\n"
    assert upward_in("agspec.drafter.probe", src) == [
        "1: drafter imports agspec.lab.run (lab)",
        "2: drafter imports agspec.cli (cli)",
    ]
