"""The ``vramfit`` command line. Each subcommand is a module here, listed in ``COMMANDS``."""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from predictors.errors import FieldProblem, SpecError

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

# Adding a subcommand: write scheduler/cli/<name>.py with ``register(subparsers)`` and list it here.
COMMANDS: tuple[str, ...] = (
    "predict",
    "evaluate",
    "train",
    "catalog",
    "parse",
    "place",
    "serve",
    "collect",
    "report",
    "simulate",
    "calibrate",
    "ray_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vramfit",
        description="Predict peak VRAM and runtime of training jobs; place them on the cheapest pool that fits.",
    )
    from scheduler.cli.server_common import package_version

    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        module = importlib.import_module(f"scheduler.cli.{name}")
        module.register(sub)
    return parser


def check_output_file(path: Path, flag: str) -> None:
    """Refuse, before any work is done, an output file that cannot be written: a folder, or a file whose folder
    cannot be created or written in. Creates the missing folders (the writers would)."""
    if path.is_dir():
        raise SpecError.one(flag, f"{path} is a folder, not a file", f"give the path of a file (one in {path}, say)")
    _check_writable_folder(path.parent, flag)


def check_output_folder(path: Path, flag: str) -> None:
    """Refuse, before any work is done, an output folder that cannot be created or written in (creates it)."""
    if path.exists() and not path.is_dir():
        raise SpecError.one(flag, f"{path} is a file, not a folder", "give a folder path")
    _check_writable_folder(path, flag)


def _check_writable_folder(folder: Path, flag: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError.one(flag, f"cannot create the folder {folder}: {exc.strerror or exc}") from None
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise SpecError.one(flag, f"cannot write files in the folder {folder}: {exc.strerror or exc}") from None


def validation_problems(exc: ValidationError, model: type[BaseModel], prefix: str = "") -> list[FieldProblem]:
    """:func:`predictors.spec.problems_from_validation` for a model other than the TrainingSpec: a field that is
    not one of ``model``'s lists ``model``'s fields (not the TrainingSpec's)."""
    from predictors.spec import problems_from_validation

    known = ", ".join(sorted(f.alias or name for name, f in model.model_fields.items()))
    return [replace(p, hint=f"remove it; known fields: {known}") if p.message == "is not a known field"
            and p.hint.startswith("remove it; known fields:") else p for p in problems_from_validation(exc, prefix)]


def _format_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                    line: str | None = None) -> str:
    """A warning as the command's user reads it: what and what to do, without the source line that raised it."""
    return f"vramfit: warning: {message}\n"


def main(argv: Sequence[str] | None = None) -> int:
    warnings.formatwarning = _format_warning
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SpecError as exc:
        print(f"vramfit: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
