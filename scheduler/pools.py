"""Node pools: the GPU capacity placement chooses from, with prices. A strict schema and one loader.

The catalog answers questions about pools ("usable bytes of this pool's GPU", "price of a GPU-hour");
:mod:`scheduler.cost` prices a time span; :mod:`scheduler.placement` searches and ranks.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from predictors.errors import FieldProblem, SpecError
from predictors.hardware import GpuSpec, lookup_gpu
from predictors.runtime import Interconnect
from scheduler.spec.yamltext import YAML_ERRORS, safe_load, yaml_error_hint, yaml_error_text

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# The webhook writes the pool name as a label value (Kueue flavor / vramfit.io/pool), and the Kubernetes API
# rejects label values over 63 characters (Kubernetes docs, "Labels and Selectors": "must be 63 characters or
# less").
MAX_NAME_LENGTH = 63
MAX_GPUS_PER_NODE = 64
# A million nodes is far beyond any cluster built (the largest hold a few 10^5 GPUs); beyond it a pools file is a typo,
# and the GPU counts placement tries (up to nodes x gpus_per_node) leave the range of floats: 10^400 nodes was a
# traceback (OverflowError), and with pools of 10^4000 nodes one placement with suggestions ran past 20 s
MAX_NODES = 10**6


class Toleration(BaseModel):
    """A Kubernetes toleration the job's pods need to land on this pool."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    key: str | None = Field(None, description="Taint key (empty with Exists: tolerate everything)")
    operator: Literal["Equal", "Exists"] = Field("Equal", description="Equal or Exists")
    value: str | None = Field(None, description="Taint value for Equal")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(None, description="Taint effect")

    @model_validator(mode="after")
    def _kubernetes_rules(self) -> Toleration:
        # The API server rejects these two shapes (Kubernetes API reference, core/v1 Toleration: "If the key is
        # empty, operator must be Exists"; "If the operator is Exists, the value should be empty"), so every pod
        # placed on the pool would be refused at creation: say so when the pools file is read instead.
        if not self.key and self.operator == "Equal":
            raise ValueError("has no `key`, so its operator must be Exists (Kubernetes rejects Equal with an "
                             "empty key)")
        if self.operator == "Exists" and self.value:
            raise ValueError(f"has operator Exists, so it must not set `value` (got {self.value!r}; Kubernetes "
                             "rejects it)")
        return self


# The slowest link a GPU pool plausibly has: 1 Gb/s Ethernet (125e6 bytes/s). A smaller figure is a unit slip
# (`400` meant as 400 Gb/s, or gigabytes), which would make every multi-GPU runtime absurdly long without a word.
MIN_LINK_BYTES_PER_SECOND = 125e6


class InterconnectOverride(BaseModel):
    """Link bandwidths of a pool when they differ from the GPU's defaults (per GPU, one direction)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    intra_node_bytes_per_second: float | None = Field(
        None, gt=0, description="GPU-to-GPU inside a node (default: NVLink if the GPU has it, else PCIe)")
    inter_node_bytes_per_second: float | None = Field(
        None, gt=0, description="Network between nodes per GPU (default: 400 Gb/s = 50e9)")

    @field_validator("intra_node_bytes_per_second", "inter_node_bytes_per_second")
    @classmethod
    def _bytes_per_second(cls, value: float | None) -> float | None:
        if value is not None and value < MIN_LINK_BYTES_PER_SECOND:
            raise ValueError(f"is in bytes per second and must be at least {MIN_LINK_BYTES_PER_SECOND:.3g} "
                             "(1 Gb/s): write e.g. 400 Gb/s as 50e9")
        return value


class NodePool(BaseModel):
    """One pool of identical GPU nodes."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(..., description="Pool name (lowercase letters, digits, '-'; at most 63 characters)")
    gpu: str = Field(..., description="GPU type: a catalog name or alias (`vramfit gpus`)")
    gpus_per_node: int = Field(..., gt=0, le=MAX_GPUS_PER_NODE, description="GPUs in one node")
    nodes: int = Field(..., gt=0, le=MAX_NODES, description="Nodes in the pool (at most a million)")
    price_usd_per_gpu_hour: float = Field(..., gt=0, description="On-demand price of one GPU for one hour, USD")
    price_source: str = Field("", description="Where the price comes from")
    free_gpus: int | None = Field(None, ge=0, description="GPUs free now (capacity); unset: not known, assume room")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels the job must select")
    tolerations: list[Toleration] = Field(default_factory=list, description="Tolerations the job needs")
    interconnect: InterconnectOverride | None = Field(None, description="Link bandwidth overrides")
    max_gpus_per_job: int | None = Field(None, gt=0, description="Largest job this pool accepts, in GPUs")

    @model_validator(mode="before")
    @classmethod
    def _interconnect_word(cls, data: Any) -> Any:
        """``interconnect: nvlink`` / ``pcie``, shorthand for the GPU's own NVLink (the default) or its PCIe link
        inside a node; a mapping gives bandwidths."""
        if not (isinstance(data, dict) and isinstance(data.get("interconnect"), str)):
            return data
        word = data["interconnect"].strip().lower()
        if word not in ("nvlink", "pcie"):
            raise ValueError(f"`interconnect` must be nvlink, pcie or a mapping of intra_node_bytes_per_second / "
                             f"inter_node_bytes_per_second; got {data['interconnect']!r}")
        try:
            spec = lookup_gpu(str(data.get("gpu")))
        except SpecError:
            return {**data, "interconnect": None}  # the gpu field's own error says what is wrong
        if word == "pcie":
            return {**data, "interconnect": {"intra_node_bytes_per_second": spec.pcie_bytes_per_second}}
        if spec.nvlink_bytes_per_second is None:
            raise ValueError(f"`interconnect: nvlink`, but {spec.name} has no NVLink (PCIe only); write pcie")
        return {**data, "interconnect": None}

    @field_validator("gpus_per_node", "nodes", "price_usd_per_gpu_hour", "free_gpus", "max_gpus_per_job",
                     mode="before")
    @classmethod
    def _not_bool(cls, value: Any) -> Any:
        return _reject_bool(value)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        # no `got {value!r}` here: the loader's message adds the input itself
        if not _NAME.match(value):
            raise ValueError("must be lowercase letters, digits and '-', starting and ending with a letter or digit "
                             "(a Kubernetes label value)")
        if len(value) > MAX_NAME_LENGTH:
            raise ValueError(f"must be at most {MAX_NAME_LENGTH} characters (a Kubernetes label value), not "
                             f"{len(value)}")
        return value

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, value: str) -> str:
        try:
            return lookup_gpu(value).name
        except SpecError as exc:
            raise ValueError(exc.problems[0].message + ". " + exc.problems[0].hint) from None

    @model_validator(mode="after")
    def _capacity(self) -> NodePool:
        if self.free_gpus is not None and self.free_gpus > self.total_gpus:
            raise ValueError(f"free_gpus ({self.free_gpus}) exceeds the pool's {self.total_gpus} GPUs "
                             f"(gpus_per_node x nodes)")
        return self

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def max_job_gpus(self) -> int:
        return min(self.total_gpus, self.max_gpus_per_job or self.total_gpus)

    @property
    def gpu_spec(self) -> GpuSpec:
        return lookup_gpu(self.gpu)

    @property
    def links(self) -> Interconnect:
        over = self.interconnect
        if over is None:  # placement asks per pool and decision: no validated empty override each time
            return Interconnect(gpus_per_node=self.gpus_per_node)
        return Interconnect(gpus_per_node=self.gpus_per_node,
                            intra_node_bytes_per_second=over.intra_node_bytes_per_second,
                            inter_node_bytes_per_second=over.inter_node_bytes_per_second)

    def usable_bytes(self, headroom_fraction: float) -> int:
        """GPU memory placement may fill: the card's total minus the headroom."""
        return usable_memory_bytes(self.gpu_spec.memory_bytes, headroom_fraction)

    def nodes_for(self, gpus: int) -> int:
        return -(-gpus // self.gpus_per_node)


def _reject_bool(value: Any) -> Any:
    """A YAML ``true``/``false`` where a number belongs is a slip (pydantic would read it as 1 or 0)."""
    if isinstance(value, bool):
        raise ValueError("must be a number, not a boolean")
    return value


def usable_memory_bytes(memory_bytes: int, headroom_fraction: float) -> int:
    """GPU memory placement may fill on a card of ``memory_bytes``: its total minus the headroom."""
    return int(memory_bytes * (1.0 - headroom_fraction))


class PoolsConfig(BaseModel):
    """A pools file: ``pools: [...]`` and optionally the memory headroom placement keeps free."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    pools: list[NodePool] = Field(..., min_length=1, description="The node pools")
    headroom_fraction: float | None = Field(
        None, ge=0, lt=1, description="Fraction of each GPU's memory kept free (default 0.05)")

    @field_validator("headroom_fraction", mode="before")
    @classmethod
    def _not_bool(cls, value: Any) -> Any:
        return _reject_bool(value)

    @model_validator(mode="after")
    def _unique(self) -> PoolsConfig:
        seen: set[str] = set()
        for pool in self.pools:
            if pool.name in seen:
                raise ValueError(f"pool name {pool.name!r} is used twice; names must be unique")
            seen.add(pool.name)
        return self


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for item in loc:
        if isinstance(item, int):
            out += f"[{item}]"
        elif not str(item).startswith(("function-", "literal[")):
            out += ("." if out else "") + str(item)
    return out


def _problems(exc: ValidationError) -> list[FieldProblem]:
    problems: list[FieldProblem] = []
    for err in exc.errors():
        path = _path(tuple(err.get("loc", ())))
        got = err.get("input")
        msg = str(err.get("msg", "is invalid")).replace("Value error, ", "").replace("Input should be", "must be")
        hint = ""
        if err.get("type") == "extra_forbidden":
            msg, hint = "is not a known field", "remove it (see `vramfit place --help` for the pools schema)"
        elif err.get("type") == "missing":
            msg = "is required"
        elif got is not None and not isinstance(got, dict | list):
            msg += f"; got {got!r}"
        problems.append(FieldProblem(path, msg, hint))
    return problems


def parse_pools(data: Any, source: str = "<pools>") -> PoolsConfig:
    """Validate a pools mapping, reporting every problem at once with its path (``pools[2].gpu``)."""
    if not isinstance(data, dict):
        raise SpecError.one("", "must be a mapping with a `pools:` list", "write `pools: [{name: ..., ...}]`", source)
    try:
        return PoolsConfig.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_problems(exc), source=source) from None


def parse_pools_text(text: str, source: str = "<pools>") -> PoolsConfig:
    try:
        data = safe_load(text)
    except YAML_ERRORS as exc:
        raise SpecError.one("", yaml_error_text(exc), yaml_error_hint(exc), source) from None
    return parse_pools(data, source)


def load_pools(path: str | Path) -> PoolsConfig:
    """Read a pools file (the only file I/O of this module)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError.one("", f"cannot read pools file {p}: {exc.strerror or exc}",
                            "check the --pools path") from None
    except UnicodeDecodeError as exc:  # a binary file, or another encoding
        raise SpecError.one("", f"cannot read pools file {p}: not UTF-8 text ({exc.reason} at byte {exc.start})",
                            "give a YAML pools file") from None
    return parse_pools_text(text, str(p))


@cache
def default_pools() -> PoolsConfig:
    """The embedded default: L40S, A100-80GB, H100-80GB and B200 pools at cited typical prices."""
    text = (resources.files("scheduler") / "data" / "pools.yaml").read_text(encoding="utf-8")
    return parse_pools_text(text, "scheduler/data/pools.yaml")
