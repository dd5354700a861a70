"""GPU types: memory as the device reports it, dense throughput, bandwidths. Data in ``data/gpus.yaml``.

Every figure in the YAML carries a source. Memory is what ``nvidia-smi``/NVML report as total (MiB x 2^20),
which is what a job can fill, not the marketed GB figure.
"""

from __future__ import annotations

import difflib
from functools import cache, lru_cache
from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from predictors.errors import SpecError

Family = Literal["volta", "turing", "ampere", "ada", "hopper", "blackwell"]


class GpuSpec(BaseModel):
    """One GPU type of the catalog."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(..., description="Catalog name, e.g. H100-80GB")
    aliases: tuple[str, ...] = Field((), description="Other names (accelerator_type labels, SKUs)")
    family: Family = Field(..., description="Architecture generation")
    memory_bytes: int = Field(..., gt=0, description="Total memory as NVML reports it")
    memory_bandwidth_bytes_per_second: float = Field(..., gt=0)
    bf16_dense_flops: float | None = Field(None, description="Dense BF16 tensor FLOP/s (None: no BF16)")
    fp16_dense_flops: float = Field(..., gt=0, description="Dense FP16 tensor FLOP/s (FP32 accumulate)")
    fp8_dense_flops: float | None = Field(None, description="Dense FP8 tensor FLOP/s (None: no FP8)")
    fp32_flops: float = Field(..., gt=0, description="FP32 (non-tensor) FLOP/s")
    tf32_dense_flops: float | None = Field(None, description="Dense TF32 tensor FLOP/s")
    nvlink_bytes_per_second: float | None = Field(
        None, description="NVLink bandwidth per GPU, one direction (None: PCIe only)")
    pcie_bytes_per_second: float = Field(..., gt=0, description="PCIe bandwidth per GPU, one direction")
    tdp_watts: float | None = None
    sources: tuple[str, ...] = Field(..., min_length=1, description="Where the numbers come from")
    notes: str = ""

    def runs(self, precision: str) -> bool:
        """Whether the GPU can run a TrainingSpec precision: bf16 needs bf16 support (Ampere and later; Volta and
        Turing have none, ``bf16_dense_flops`` null in the catalog)."""
        return not precision.startswith("bf16") or self.bf16_dense_flops is not None

    def dense_flops(self, precision: str, tf32: bool = False) -> float:
        """Peak dense tensor FLOP/s for a TrainingSpec precision (``tf32``: fp32 matmuls allowed to run as TF32)."""
        if precision.startswith("bf16"):
            return self.bf16_dense_flops or self.fp16_dense_flops
        if precision.startswith("16"):
            return self.fp16_dense_flops
        # fp32 matmuls run on the CUDA cores, not as TF32 on the tensor cores: PyTorch has defaulted
        # torch.backends.cuda.matmul.allow_tf32 to False since 1.12 (PyTorch docs, CUDA semantics, "TensorFloat-32
        # (TF32) on Ampere (and later) devices"), and HF Trainer's tf32 defaults to leaving that as it is; a job that
        # turns it on (the spec's tf32) gets the tensor cores' TF32 rate where the GPU has one (not before Ampere)
        if tf32 and self.tf32_dense_flops:
            return self.tf32_dense_flops
        return self.fp32_flops

    def runs_tf32(self, spec_tf32: bool | None) -> bool:
        """Whether fp32 matmuls of a job that asks for TF32 (``spec_tf32``) run as TF32 on this GPU."""
        return bool(spec_tf32) and bool(self.tf32_dense_flops)


class _GpuFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpus: list[GpuSpec]


def _norm(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


@cache
def gpu_catalog() -> dict[str, GpuSpec]:
    text = (resources.files("predictors") / "data" / "gpus.yaml").read_text(encoding="utf-8")
    parsed = _GpuFile.model_validate(yaml.safe_load(text))
    return {g.name: g for g in parsed.gpus}


@cache
def _gpu_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for gpu in gpu_catalog().values():
        for key in (gpu.name, *gpu.aliases):
            index.setdefault(_norm(key), gpu.name)
    return index


@lru_cache(maxsize=1024)  # placement looks up every pool's GPU per decision
def _catalog_name(name: str) -> str | None:
    """The catalog name ``name`` stands for, or ``None``."""
    key = _norm(name)
    index = _gpu_index()
    if key in index:
        return index[key]
    for prefix in ("nvidia", "tesla", "geforce"):
        if key.startswith(prefix) and key[len(prefix):] in index:
            return index[key[len(prefix):]]
    return None


def alias_alternatives(name: str) -> list[str]:
    """Other catalog GPUs a short name could have meant: ``A100`` resolves to the A100-80GB, but the A100-40GB and the
    PCIe card share the name. Empty when the name is a catalog name or unambiguous."""
    found = _catalog_name(name)
    key = _norm(name)
    if found is None or key == _norm(found):
        return []
    for prefix in ("nvidia", "tesla", "geforce"):
        key = key.removeprefix(prefix)
    return [g for g in gpu_catalog() if g != found and _norm(g).startswith(key)]


def lookup_gpu(name: str, path: str = "spec.gpu") -> GpuSpec:
    """Find a GPU by name or alias (``H100``, ``NVIDIA-H100-80GB-HBM3``, ``a100-80gb``)."""
    found = _catalog_name(name)
    if found is not None:
        return gpu_catalog()[found]
    close = difflib.get_close_matches(name, list(gpu_catalog()), n=3, cutoff=0.4)
    hint = (f"did you mean {', '.join(close)}? " if close else "") + "Run `vramfit gpus` for the catalog"
    raise SpecError.one(path, f"unknown GPU {name!r}", hint)
