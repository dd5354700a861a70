"""Sweep files: a base spec, grids of axes and an explicit list, expanded into TrainingSpecs with stable ids.

A sweep is YAML (or JSON)::

    name: default
    settings: {warmup_steps: 2, measured_steps: 3, timeout_seconds: 900}
    models:                       # named variants usable wherever a spec names a model
      llama-3.1-8b-4l: {from: llama-3.1-8b, layers: 4}
      tiny-llama: {config: {model_type: llama, hidden_size: 64, ...}}
    base: {precision: bf16-true, seq_len: 2048}      # merged into every config
    grids:
      - name: lora-targets
        base: {method: lora}                         # merged over the sweep's base
        axes: {model: [llama-3.2-1b, qwen2.5-1.5b], lora.target_modules: [[q_proj, v_proj], all-linear]}
    configs:                                         # explicit specs, merged over the sweep's base
      - {model: gpt2, precision: 32-true}

Every combination is a TrainingSpec v1 (validated strictly, all problems reported at once). Axis names are
spec fields; dotted names (``lora.rank``) set a nested field. Settings that do not apply to a method are
dropped so that one grid can cross methods: ``lora`` for full fine-tuning, ``quantization`` unless qlora.
Models are written inline (``{name, config}``) so that a row is self-contained. The id of a config is a hash
of its complete spec, so it does not change when the sweep is reordered or regrouped.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from predictors.catalog import lookup_model
from predictors.errors import FieldProblem, SpecError
from predictors.spec import TrainingSpec, parse_training_spec, spec_to_dict
from scheduler.cli import validation_problems
from scheduler.spec.yamltext import YAML_ERRORS, safe_load, yaml_error_hint, yaml_error_text

# Keys that hold the layer count in Hugging Face configs (family-specific names besides the generic one).
LAYER_KEYS: tuple[str, ...] = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


class RunSettings(BaseModel):
    """How each config is run (the defaults of the runner; the command line can override them)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    warmup_steps: int = Field(2, ge=0, description="Optimizer steps before measuring (not timed)")
    measured_steps: int = Field(3, gt=0, description="Optimizer steps timed for tokens/s")
    timeout_seconds: float = Field(900, gt=0, description="Wall-clock budget of one config's process")


class ModelVariant(BaseModel):
    """A named model for the sweep: a catalog config (optionally scaled down) or an inline config."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    from_: str | None = Field(None, alias="from", description="Catalog model whose config is the starting point")
    config: dict[str, Any] | None = Field(None, description="Inline Hugging Face config (instead of `from`)")
    layers: int | None = Field(None, gt=0, description="Override the number of transformer layers")
    override: dict[str, Any] = Field(default_factory=dict, description="Other config fields to set")

    @model_validator(mode="after")
    def _one_source(self) -> ModelVariant:
        if (self.from_ is None) == (self.config is None):
            raise ValueError("give exactly one of `from` (a catalog model) or `config` (inline)")
        return self


class Grid(BaseModel):
    """A Cartesian product over spec fields, merged over the sweep's base."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., min_length=1, description="Group label, recorded in each row")
    base: dict[str, Any] = Field(default_factory=dict, description="Spec fields common to this grid")
    axes: dict[str, list[Any]] = Field(default_factory=dict, description="Spec field (dotted) -> values")
    timeout_seconds: float | None = Field(None, gt=0, description="Budget per config of this grid (overrides "
                                          "the sweep's and the command line's)")

    @field_validator("axes")
    @classmethod
    def _nonempty(cls, axes: dict[str, list[Any]]) -> dict[str, list[Any]]:
        empty = [name for name, values in axes.items() if not values]
        if empty:
            raise ValueError(f"axes {', '.join(empty)} have no values")
        return axes


class Sweep(BaseModel):
    """A calibration sweep file."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., min_length=1, description="Sweep label, recorded in each row")
    description: str = Field("", description="Free text")
    settings: RunSettings = Field(default_factory=RunSettings, description="Steps and time budget")
    models: dict[str, ModelVariant] = Field(default_factory=dict, description="Named model variants")
    base: dict[str, Any] = Field(default_factory=dict, description="Spec fields common to every config")
    grids: list[Grid] = Field(default_factory=list, description="Grids of configs")
    configs: list[dict[str, Any]] = Field(default_factory=list, description="Explicit configs")


@dataclass(frozen=True)
class SweepConfig:
    """One expanded config: its stable id, the group it came from and its complete spec."""

    config_id: str
    group: str
    spec: TrainingSpec
    spec_dict: dict[str, Any]
    timeout_seconds: float | None = None

    @property
    def summary(self) -> str:
        s = self.spec
        switches = "".join(f" {name}" for name in ("optimizer_in_backward", "fused_optimizer", "activation_offloading",
                                                   "torch_compile") if getattr(s, name))
        loss = f" ce={s.cross_entropy}" if s.cross_entropy not in (None, "full") else ""
        every = f"/{s.checkpoint_every_n_layers}" if (s.checkpoint_every_n_layers or 1) > 1 else ""
        return (f"{s.model_name} {s.task} {s.method} {s.precision} {s.optimizer} mbs={s.micro_batch_size} "
                f"seq={s.seq_len} ckpt={s.gradient_checkpointing}{every} attn={s.attention}{switches}{loss}")


def complete_spec_dict(spec: TrainingSpec) -> dict[str, Any]:
    """The spec with every field written out, method-dependent defaults resolved (as reference runs are)."""
    out = spec_to_dict(spec)
    out.pop("apiVersion", None)
    out.pop("kind", None)
    out["sharding"] = spec.resolved_sharding()
    lora = spec.resolved_lora
    if lora is not None:
        out["lora"] = lora.model_dump(mode="json")
    quantization = spec.resolved_quantization
    if quantization is not None:
        out["quantization"] = quantization
    return out


def config_id_for(spec_dict: dict[str, Any]) -> str:
    """A stable short id: the first 8 hex digits of the SHA-256 of the canonical JSON of the spec."""
    canonical = json.dumps(spec_dict, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:8]


def scale_config(config: dict[str, Any], layers: int | None, override: dict[str, Any]) -> dict[str, Any]:
    """A copy of a HF config with fewer (or more) layers and other fields overridden."""
    out = copy.deepcopy(config)
    if layers is not None:
        present = [key for key in LAYER_KEYS if key in out]
        for key in present or ["num_hidden_layers"]:
            out[key] = layers
        if isinstance(out.get("layer_types"), list):
            types = out["layer_types"]
            out["layer_types"] = [types[i % len(types)] for i in range(layers)]
    out.update(copy.deepcopy(override))
    return out


def _variant_config(variant: ModelVariant) -> dict[str, Any]:
    base = lookup_model(variant.from_).config if variant.from_ is not None else variant.config
    assert base is not None
    return scale_config(base, variant.layers, variant.override)


def _inline_model(model: Any, variants: dict[str, dict[str, Any]], base_dir: Path | None) -> Any:
    """Write a model reference as ``{name, config}``; leave what cannot be resolved for the spec to reject."""
    if isinstance(model, str):
        if model in variants:
            return {"name": model, "config": copy.deepcopy(variants[model])}
        entry = lookup_model(model)
        return {"name": entry.name, "config": copy.deepcopy(entry.config)}
    if not isinstance(model, dict):
        return model
    out = dict(model)
    if out.get("config") is None and isinstance(out.get("config_path"), str):
        path = Path(out.pop("config_path"))
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        try:
            out["config"] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise SpecError.one("model.config_path", f"cannot read {path}: {exc}") from None
        out.setdefault("name", path.parent.name or "custom")
    elif out.get("config") is None and isinstance(out.get("name"), str):
        inlined = _inline_model(out["name"], variants, base_dir)
        out["name"], out["config"] = inlined["name"], inlined["config"]
    return out


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``extra`` over ``base`` (mappings merge; everything else replaces)."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key != "model":
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _set_dotted(target: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = target
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[leaf] = copy.deepcopy(value)


def _drop_inapplicable(raw: dict[str, Any]) -> dict[str, Any]:
    method = str(raw.get("method", "full")).strip().lower()
    if method == "full":
        raw.pop("lora", None)
    if method != "qlora":
        raw.pop("quantization", None)
    return raw


def _combinations(grid: Grid) -> list[dict[str, Any]]:
    names = list(grid.axes)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*grid.axes.values())]


def expand_sweep(sweep: Sweep, base_dir: Path | None = None, source: str = "") -> list[SweepConfig]:
    """All configs of a sweep in file order, duplicates (same complete spec) kept once."""
    problems: list[FieldProblem] = []
    variants: dict[str, dict[str, Any]] = {}
    for name, variant in sweep.models.items():
        try:
            variants[name] = _variant_config(variant)
        except SpecError as exc:
            problems += [FieldProblem(f"models.{name}.from", p.message, p.hint) for p in exc.problems]

    raw_configs: list[tuple[str, Grid | None, dict[str, Any]]] = []  # (path, grid, raw spec)
    for g, grid in enumerate(sweep.grids):
        grid_base = _merge(sweep.base, grid.base)
        for c, combo in enumerate(_combinations(grid)):
            raw = copy.deepcopy(grid_base)
            for dotted, value in combo.items():
                _set_dotted(raw, dotted, value)
            raw_configs.append((f"grids[{g}]({grid.name}).combination[{c}]", grid, raw))
    for c, explicit in enumerate(sweep.configs):
        raw_configs.append((f"configs[{c}]", None, _merge(sweep.base, explicit)))

    out: list[SweepConfig] = []
    seen: set[str] = set()
    for path, grid, raw in raw_configs:
        try:
            raw = _drop_inapplicable(raw)
            if "model" in raw:
                raw["model"] = _inline_model(raw["model"], variants, base_dir)
            spec = parse_training_spec(raw, source=source, prefix=path)
        except SpecError as exc:
            problems += [FieldProblem(p.path if p.path.startswith(path) else f"{path}.{p.path.removeprefix('spec.')}",
                                      p.message, p.hint) for p in exc.problems]
            continue
        spec_dict = complete_spec_dict(spec)
        config_id = config_id_for(spec_dict)
        if config_id in seen:
            continue
        seen.add(config_id)
        out.append(SweepConfig(config_id, grid.name if grid else "configs", spec, spec_dict,
                               grid.timeout_seconds if grid else None))
    if problems:
        raise SpecError(problems, source=source)
    return out


def parse_sweep(data: Any, source: str = "<sweep>") -> Sweep:
    """Validate a sweep mapping, reporting every problem with its path."""
    if not isinstance(data, dict):
        raise SpecError.one("", f"a sweep must be a mapping; got {type(data).__name__}",
                            "write `name:`, `base:`, `grids:` and/or `configs:`", source)
    try:
        return Sweep.model_validate(data)
    except ValidationError as exc:
        raise SpecError(validation_problems(exc, Sweep), source=source) from None


def load_sweep(path: Path) -> tuple[Sweep, list[SweepConfig]]:
    """Read, validate and expand a sweep file (YAML or JSON)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError.one("--sweep", f"cannot read {path}: {exc}") from None
    try:
        data = safe_load(text)
    except YAML_ERRORS as exc:
        raise SpecError.one("", yaml_error_text(exc), yaml_error_hint(exc), source=str(path)) from None
    sweep = parse_sweep(data, source=str(path))
    return sweep, expand_sweep(sweep, base_dir=path.parent, source=str(path))
