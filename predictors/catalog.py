"""The model catalog: named Hugging Face configs shipped as data, and resolution of a spec's model.

Each ``predictors/data/models/<name>.json`` is a ``config.json`` plus ``_source`` (where it was read),
``_hf_ids`` (Hugging Face ids that resolve to it), optional ``_aliases`` and ``_params_published``
(a published total to pin the count against). Reading package data is the only file access here.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from predictors.architecture import Architecture, architecture_from_config
from predictors.errors import FieldProblem, SpecError
from predictors.spec import ModelRef, TrainingSpec


@dataclass(frozen=True)
class CatalogModel:
    name: str
    config: dict[str, Any]
    hf_ids: tuple[str, ...]
    aliases: tuple[str, ...]
    source: tuple[str, ...]
    params_published: int | None


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


@cache
def catalog() -> dict[str, CatalogModel]:
    """All catalog models by canonical name."""
    models: dict[str, CatalogModel] = {}
    folder = resources.files("predictors") / "data" / "models"
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if not entry.name.endswith(".json"):
            continue
        raw = json.loads(entry.read_text(encoding="utf-8"))
        src = raw.get("_source", [])
        name = entry.name[: -len(".json")]
        models[name] = CatalogModel(
            name=name,
            config={k: v for k, v in raw.items() if not k.startswith("_")},
            hf_ids=tuple(raw.get("_hf_ids", [])),
            aliases=tuple(raw.get("_aliases", [])),
            source=tuple(src if isinstance(src, list) else [src]),
            params_published=raw.get("_params_published"),
        )
    return models


@cache
def _index() -> dict[str, str]:
    index: dict[str, str] = {}
    for name, model in catalog().items():
        keys = [name, *model.aliases, *model.hf_ids]
        keys += [hf.split("/", 1)[-1] for hf in model.hf_ids]
        for key in keys:
            index.setdefault(_norm(key), name)
    return index


def lookup_model(name: str) -> CatalogModel:
    """Find a catalog model by name, alias or Hugging Face id; suggest close names when unknown."""
    key = _norm(name)
    index = _index()
    if key in index:
        return catalog()[index[key]]
    tail = _norm(name.split("/", 1)[-1])
    if tail in index:
        return catalog()[index[tail]]
    close = difflib.get_close_matches(tail, list(index), n=4, cutoff=0.6)
    names = list(dict.fromkeys(index[c] for c in close))  # closest first
    hint = (f"did you mean {', '.join(names)}? " if names else "") + (
        "Run `vramfit models` for the catalog, or give the model's config.json as "
        "`model: {config_path: ./config.json}`"
    )
    raise SpecError.one("spec.model", f"unknown model {name!r}", hint)


@dataclass(frozen=True)
class ResolvedModel:
    """A spec's model with its architecture and where the numbers came from."""

    label: str
    architecture: Architecture
    params_override: int | None
    source: str  # "catalog:<name>", "inline config", or a file path
    teacher: ResolvedModel | None = None  # the spec's teacher_model (knowledge distillation)
    critic: ResolvedModel | None = None  # the spec's critic_model (PPO's value model)

    @property
    def teacher_architecture(self) -> Architecture | None:
        return self.teacher.architecture if self.teacher is not None else None

    @property
    def critic_architecture(self) -> Architecture | None:
        return self.critic.architecture if self.critic is not None else None

    @property
    def params_total(self) -> int:
        return self.params_override or self.architecture.params_total


def resolve_model(spec: TrainingSpec, base_dir: Path | None = None) -> ResolvedModel:
    """Resolve ``spec.model`` into an architecture (catalog entry, inline config or config file), and
    ``spec.teacher_model`` and ``spec.critic_model`` likewise when the spec names them."""
    student = _resolve(spec.model, base_dir)
    teacher = _resolve_other(spec.teacher_model, "teacher_model", base_dir)
    critic = _resolve_other(spec.critic_model, "critic_model", base_dir)
    if teacher is None and critic is None:
        return student
    return replace(student, teacher=teacher, critic=critic)


def _resolve_other(ref: str | ModelRef | None, field: str, base_dir: Path | None) -> ResolvedModel | None:
    """A model beside the trained one (``field``: teacher_model, critic_model), its errors naming that field."""
    if ref is None:
        return None
    try:
        return _resolve(ref, base_dir)
    except SpecError as exc:
        raise SpecError([FieldProblem(_field_path(p.path, field), p.message, p.hint) for p in exc.problems],
                        exc.source) from None


def _field_path(path: str, field: str) -> str:
    """``spec.model...`` / ``model...`` (where the model's errors point) -> ``field``'s path."""
    for prefix in ("spec.model", "model"):
        if path == prefix or path.startswith(prefix + "."):
            return prefix.replace("model", field) + path[len(prefix):]
    return path


def _resolve(ref: str | ModelRef, base_dir: Path | None) -> ResolvedModel:
    if isinstance(ref, str):
        entry = lookup_model(ref)
        return ResolvedModel(entry.name, architecture_from_config(entry.config, entry.name), None,
                             f"catalog:{entry.name}")
    return _resolve_ref(ref, base_dir)


# A Hugging Face config.json is a few kilobytes; anything far larger is not one (and /dev/zero never ends)
MAX_CONFIG_FILE_BYTES = 4 * 2**20


def _read_config_file(path: Path) -> str:
    """The text of a config file: a regular file of at most MAX_CONFIG_FILE_BYTES (not a device, FIFO or folder,
    which could block or never end), read with that bound."""
    if path.exists() and not path.is_file():
        raise OSError(f"{path} is not a regular file")
    with path.open("rb") as handle:
        data = handle.read(MAX_CONFIG_FILE_BYTES + 1)
    if len(data) > MAX_CONFIG_FILE_BYTES:
        raise OSError(f"{path} is larger than {MAX_CONFIG_FILE_BYTES // 2**20} MiB: not a config.json")
    return data.decode("utf-8")


def _resolve_ref(ref: ModelRef, base_dir: Path | None) -> ResolvedModel:
    params = int(ref.params) if ref.params else None
    if ref.config is not None:
        label = ref.name or str(ref.config.get("_name_or_path") or "custom")
        return ResolvedModel(label, architecture_from_config(ref.config, label), params, "inline config")
    if ref.config_path is not None:
        path = Path(ref.config_path)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        try:
            config = json.loads(_read_config_file(path))
        except FileNotFoundError:
            raise SpecError.one(
                "spec.model.config_path", f"file not found: {path}",
                "give a path to a Hugging Face config.json (relative to the spec file)",
            ) from None
        except (OSError, ValueError, RecursionError) as exc:  # ValueError: bad JSON or UTF-8, a 4,300+ digit int
            raise SpecError.one("spec.model.config_path", f"cannot read {path} as JSON: {exc}") from None
        label = ref.name or path.parent.name or "custom"
        return ResolvedModel(label, architecture_from_config(config, label), params, str(path))
    assert ref.name is not None
    entry = lookup_model(ref.name)
    return ResolvedModel(entry.name, architecture_from_config(entry.config, entry.name), params,
                         f"catalog:{entry.name}")
