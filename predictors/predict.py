"""One entry point for a full prediction of a TrainingSpec: model resolution, VRAM, runtime, bound."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from predictors.catalog import ResolvedModel, resolve_model
from predictors.features import resident_bytes
from predictors.hardware import GpuSpec, lookup_gpu
from predictors.runtime import Interconnect, RuntimePrediction, predict_runtime
from predictors.spec import TrainingSpec
from predictors.vram import (
    VramPrediction,
    colocated_engine_bytes,
    device_peak_on_gpu,
    on_gpu,
    predict_vram_without_gpu,
    with_breakdown,
    with_colocated_engine,
)

if TYPE_CHECKING:
    from predictors.persistence import LoadedModel

# Without a residual model (missing or incompatible, or ``residual=False``), the upper bound is the
# analytic device peak widened by this fraction — a fallback, not a calibrated bound: on the dev reference
# runs it covers 68 % of the measurements. With the shipped model it is the calibrated (conformal) bound.
DEFAULT_UPPER_MARGIN = 0.15


# The components the output contract (shared/TRAINING_SPEC.md) names in ``breakdown_bytes``: always written, 0 when
# nothing of that kind is live at the peak (the optimizer step holds no activations, a full fine-tune's backward
# peak no gradients yet), so that a reader of the contract finds every key it names.
CONTRACT_COMPONENTS: tuple[str, ...] = ("weights", "gradients", "optimizer_states", "activations", "logits",
                                        "allocator_overhead", "cuda_context")
# The level each breakdown component belongs to, for ``component_levels`` (an extension of the output contract):
# tensors count from ``peak_allocated_bytes`` up; the allocator's overhead from ``peak_reserved_bytes``; what
# lives outside the caching allocator only in ``peak_vram_bytes`` (predictors/vram.py builds the device peak as
# reserved + these). Any component not listed here is a tensor.
_RESERVED_COMPONENTS = frozenset({"allocator_overhead", "allocator_fragmentation"})
_DEVICE_COMPONENTS = frozenset({"cuda_context", "nccl_buffers", "paged_optimizer_states", "residual_correction"})
LEVELS = ("peak_allocated_bytes", "peak_reserved_bytes", "peak_vram_bytes")


def component_level(name: str) -> str:
    """The lowest of :data:`LEVELS` that the breakdown component ``name`` counts in."""
    if name in _DEVICE_COMPONENTS:
        return "peak_vram_bytes"
    if name in _RESERVED_COMPONENTS:
        return "peak_reserved_bytes"
    return "peak_allocated_bytes"


def level_corrections(vram: VramPrediction) -> dict[str, int]:
    """Per level of :data:`LEVELS`, what the residual model moved it by beyond the breakdown components that
    count in it (0 for an analytic prediction, up to rounding): ``peak_allocated_bytes`` = the components of that
    level + its correction, ``peak_reserved_bytes`` = the components of both levels + its correction, and
    ``peak_vram_bytes`` = every component, its correction being the ``residual_correction`` component."""
    sums = dict.fromkeys(LEVELS, 0)
    for name, n_bytes in vram.breakdown_bytes.items():
        if name == "residual_correction":
            continue
        for level in LEVELS[LEVELS.index(component_level(name)):]:
            sums[level] += n_bytes
    return {
        "peak_allocated_bytes": vram.peak_allocated_bytes - sums["peak_allocated_bytes"],
        "peak_reserved_bytes": vram.peak_reserved_bytes - sums["peak_reserved_bytes"],
        "peak_vram_bytes": vram.peak_vram_bytes - sums["peak_vram_bytes"],
    }


@dataclass(frozen=True)
class Prediction:
    spec: TrainingSpec
    model: ResolvedModel
    gpu: GpuSpec | None
    vram: VramPrediction
    peak_vram_upper_bytes: int
    throughput_tokens_per_second: float | None = None
    runtime_seconds: float | None = None
    model_version: str = "analytic"
    runtime: RuntimePrediction | None = None
    residual_correction_ratio: float | None = None
    # extensions of the output contract (predictors.runtime_residual): bounds and the runtime residual
    throughput_lower_tokens_per_second: float | None = None
    runtime_upper_seconds: float | None = None
    runtime_correction_ratio: float | None = None
    runtime_model_version: str | None = None

    def level_explanation(self) -> dict[str, Any]:
        """Extensions of ``vramfit predict``'s output that tie the breakdown to the three levels:
        ``component_levels`` (the lowest level each component counts in) and ``residual_correction_bytes``
        (:func:`level_corrections`). Not in :meth:`to_dict`, whose keys are what the ledger's decision accepts."""
        breakdown = {**dict.fromkeys(CONTRACT_COMPONENTS, 0), **self.vram.breakdown_bytes}
        return {"component_levels": {name: component_level(name) for name in breakdown},
                "residual_correction_bytes": level_corrections(self.vram)}

    def runtime_explanation(self) -> dict[str, Any]:
        """Extensions of ``vramfit predict``'s output that explain the runtime (empty without one): the analytic
        model's optimizer step (``runtime_step_seconds``: the parts that add up to ``step_time_seconds``;
        ``runtime_overlapped_seconds``: what runs under them), ``tokens_per_step``, and the runtime model's notes.
        ``throughput_tokens_per_second`` is ``tokens_per_step / step_time_seconds`` times
        ``runtime_correction_ratio`` (the runtime residual's correction, 1 when it has none)."""
        if self.runtime is None:
            return {}
        parts, overlapped = self.runtime.step_breakdown()
        out: dict[str, Any] = {"step_time_seconds": self.runtime.step_time_seconds,
                               "tokens_per_step": self.runtime.tokens_per_step,
                               "runtime_step_seconds": parts, "runtime_overlapped_seconds": overlapped}
        if self.runtime.notes:
            out["runtime_notes"] = list(self.runtime.notes)
        return out

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "peak_allocated_bytes": self.vram.peak_allocated_bytes,
            "peak_reserved_bytes": self.vram.peak_reserved_bytes,
            "peak_vram_bytes": self.vram.peak_vram_bytes,
            "peak_vram_upper_bytes": self.peak_vram_upper_bytes,
            "breakdown_bytes": {**dict.fromkeys(CONTRACT_COMPONENTS, 0), **self.vram.breakdown_bytes},
            "params_total": self.vram.params_total,
            "params_trainable": self.vram.params_trainable,
            "gpus": self.vram.gpus,
            "peak_phase": self.vram.peak_phase,
            "model": self.model.label,
            "model_version": self.model_version,
        }
        if self.residual_correction_ratio is not None:
            out["residual_correction_ratio"] = self.residual_correction_ratio
        if self.gpu is not None:
            out["gpu"] = self.gpu.name
        if self.throughput_tokens_per_second is not None:
            out["throughput_tokens_per_second"] = self.throughput_tokens_per_second
        if self.runtime_seconds is not None:
            out["runtime_seconds"] = self.runtime_seconds
        for name in ("throughput_lower_tokens_per_second", "runtime_upper_seconds", "runtime_correction_ratio",
                     "runtime_model_version"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.vram.notes:
            out["notes"] = list(self.vram.notes)
        return out


def resolve_gpu(spec: TrainingSpec, gpu_name: str | None = None) -> GpuSpec | None:
    name = gpu_name or spec.gpu
    if name is None:
        return None
    return lookup_gpu(name, "--gpu" if gpu_name else "spec.gpu")


def predict(
    spec: TrainingSpec,
    gpu_name: str | None = None,
    gpus: int | None = None,
    base_dir: Path | None = None,
    model: ResolvedModel | None = None,
    interconnect: Interconnect | None = None,
    residual: bool = True,
) -> Prediction:
    """Predict one spec. ``gpu_name`` overrides ``spec.gpu``; ``gpus`` overrides ``spec.gpus``.

    With a GPU known, the runtime model fills throughput and runtime (``interconnect``: the pool's links).
    With ``residual`` (default) the shipped residual model corrects the levels and supplies the calibrated
    upper bound; the analytic breakdown is kept, plus a ``residual_correction`` entry. Likewise the shipped
    runtime residual corrects throughput and runtime and supplies ``runtime_upper_seconds``.
    """
    return predict_many(spec, [(gpu_name, gpus, interconnect)], base_dir, model, residual)[0]


def predict_many(
    spec: TrainingSpec,
    requests: Sequence[tuple[str | None, int | None, Interconnect | None]],
    base_dir: Path | None = None,
    model: ResolvedModel | None = None,
    residual: bool = True,
) -> list[Prediction]:
    """:func:`predict` of one spec for each ``(gpu_name, gpus, interconnect)`` of ``requests``.

    Each prediction is the one :func:`predict` gives alone. The GPU-independent part of the VRAM model is
    computed once per GPU count, and each residual model sees all requests in one batched pass (whose fixed
    cost dominates): a fresh :class:`SpecPredictor`.
    """
    resolved = model or resolve_model(spec, base_dir)
    return SpecPredictor(spec, resolved, residual).predict_many(requests)


def _residual_model():  # type: ignore[no-untyped-def]
    """The shipped residual model (cached), or ``None`` (analytic only, warned once)."""
    from predictors.persistence import load_default_model

    return load_default_model()


def _runtime_residual_model() -> LoadedModel | None:
    """The shipped runtime residual model (cached), or ``None`` (analytic runtime, warned once)."""
    from predictors.persistence import load_default_runtime_model

    return load_default_runtime_model()


def required_bytes(upper_bytes: float, vram: VramPrediction) -> int:
    """The device memory a job needs to run without running out: its upper bound ``upper_bytes``, except that
    paged optimizer states do not need the margin. bitsandbytes' paged optimizers keep their states in CUDA managed
    memory, which the driver pages to host memory when the GPU is full and back for the update (Dettmers et al.
    2023, QLoRA, section 3 "Paged Optimizers"): they cannot run the job out of memory, only slow its update. So the
    margin covers the rest (the bound's share without the paged states), and the expected peak with the paged states
    resident must fit too, so that no paging is expected (the runtime does not count it)."""
    paged = vram.breakdown_bytes.get("paged_optimizer_states", 0)
    # The caching allocator's fragmentation of variable-length blocks (allocator_fragmentation) is cache: before an
    # allocation fails, PyTorch frees its unused cached segments and retries (slower steps, no crash), so on a GPU
    # without room for it the job reserves less (ms-swift's batch-8 run, X06-047, reserved 76.1 GiB of an A100 80GB
    # where 126 GiB is predicted with room). It never decides whether the job fits: neither it nor its share of the
    # margin has to.
    device = vram.peak_vram_bytes
    reclaimable = reclaimable_bytes(vram)
    if paged + reclaimable <= 0 or device <= 0:
        return int(upper_bytes)
    return int(max(upper_bytes * (1 - (paged + reclaimable) / device), device - reclaimable, 0))


def reclaimable_bytes(vram: VramPrediction) -> float:
    """The allocator's fragmentation in ``vram``'s device peak: the breakdown's analytic figure, scaled as the
    residual model (a site offset, a point correction) scaled the device peak around it."""
    cache = vram.breakdown_bytes.get("allocator_fragmentation", 0)
    if cache <= 0:
        return 0.0
    analytic = vram.peak_vram_bytes - vram.breakdown_bytes.get("residual_correction", 0)
    return cache * vram.peak_vram_bytes / analytic if analytic > 0 else float(cache)


def reliefs_needed(upper_bytes: float, vram: VramPrediction, usable_bytes: float) -> tuple[bool, bool]:
    """Which of :func:`required_bytes`'s two reliefs a job whose bound is above ``usable_bytes`` needs to fit there:
    (the paged optimizer states', the allocator fragmentation's). Each is needed when the other alone is not
    enough; both False when the bound fits as it is."""
    if upper_bytes <= usable_bytes:
        return False, False
    paged = vram.breakdown_bytes.get("paged_optimizer_states", 0)
    cache = vram.breakdown_bytes.get("allocator_fragmentation", 0)
    without_cache = with_breakdown(vram, {k: v for k, v in vram.breakdown_bytes.items()
                                          if k != "allocator_fragmentation"}, vram.peak_vram_bytes)
    without_paged = with_breakdown(vram, {k: v for k, v in vram.breakdown_bytes.items()
                                          if k != "paged_optimizer_states"}, vram.peak_vram_bytes)
    paged_needed = bool(paged) and required_bytes(upper_bytes, without_paged) > usable_bytes
    cache_needed = bool(cache) and required_bytes(upper_bytes, without_cache) > usable_bytes
    if not (paged_needed or cache_needed) and (paged or cache):
        # either alone would do: name the fragmentation when it alone fits the bound (no paging expected then)
        alone = bool(cache) and required_bytes(upper_bytes, without_paged) <= usable_bytes
        return not alone, alone
    return paged_needed, cache_needed


@dataclass(frozen=True)
class MemoryPrediction:
    """The memory half of a :class:`Prediction`: what placement needs to decide whether an option fits."""

    gpu: GpuSpec | None
    vram: VramPrediction
    peak_vram_upper_bytes: int
    extra: dict[str, Any]  # the residual's model version and correction ratio, when there is one

    @property
    def required_bytes(self) -> int:
        """What must fit in the GPU's usable memory (:func:`required_bytes`)."""
        return required_bytes(self.peak_vram_upper_bytes, self.vram)


class SpecPredictor:
    """The predictions of one spec on many (GPU, count, links), in two stages and memoised.

    :meth:`memory_many` gives the (corrected) VRAM and its upper bound, :meth:`predict_many` the whole
    :class:`Prediction` with throughput and runtime. Placement asks for the memory of every candidate first and
    for the runtime of the options that fit only; each stage handles all its requests in one batched call of
    its residual model. :func:`predict_many` is a fresh one; ``tests/scheduler/test_placement_batched.py``
    checks that a memoised one answers as :func:`predict` does for each request alone.
    """

    def __init__(self, spec: TrainingSpec, model: ResolvedModel, residual: bool = True) -> None:
        self.spec = spec
        self.model = model
        self.residual = residual
        self._without_gpu: dict[int | None, VramPrediction] = {}
        self._analytic: dict[tuple[str | None, int | None], tuple[GpuSpec | None, VramPrediction]] = {}
        self._memory: dict[tuple[str | None, int | None], MemoryPrediction] = {}
        # the shipped residual models, looked up once per spec (each lookup is a call through the loader's cache)
        self._vram_model = _residual_model() if residual else None
        self._runtime_model: LoadedModel | None = None  # looked up at the first runtime (VRAM-only asks need none)
        self._full: dict[tuple[str | None, int | None, Interconnect | None], Prediction] = {}
        self._runtimes: dict[tuple[str, int | None, Interconnect | None], RuntimePrediction] = {}
        self._floor_factor: tuple[float | None] | None = None  # (the factor,) once worked out

    def _runtime_residual(self) -> LoadedModel | None:
        if self._runtime_model is None and self.residual:
            self._runtime_model = _runtime_residual_model()
        return self._runtime_model

    def known_memory(self, gpu_name: str | None, gpus: int | None) -> MemoryPrediction | None:
        """The memory prediction of ``(gpu_name, gpus)`` if it was made already, else ``None``."""
        return self._memory.get((gpu_name, gpus))

    def analytic(self, gpu_name: str | None, gpus: int | None) -> tuple[GpuSpec | None, VramPrediction]:
        """The GPU and the analytic VRAM prediction of ``(gpu_name, gpus)`` (the GPU-independent part once per
        count)."""
        key = (gpu_name, gpus)
        hit = self._analytic.get(key)
        if hit is None:
            gpu = resolve_gpu(self.spec, gpu_name)
            hit = self._analytic[key] = (gpu, on_gpu(self._base(gpus), gpu))
        return hit

    def _base(self, gpus: int | None) -> VramPrediction:
        base = self._without_gpu.get(gpus)
        if base is None:
            base = self._without_gpu[gpus] = predict_vram_without_gpu(
                self.spec, self.model.architecture, gpus, self.model.params_override, self.model.teacher_architecture,
                self.model.critic_architecture)
        return base

    def upper_floor_bytes(self, gpu_name: str | None, gpus: int | None) -> int:
        """Bytes that the memory prediction's ``peak_vram_upper_bytes`` of ``(gpu_name, gpus)`` is never below,
        from the analytic prediction alone: cheap, for skipping GPU counts that surely do not fit."""
        known = self._memory.get((gpu_name, gpus))
        if known is not None:
            return known.peak_vram_upper_bytes
        base = self._base(gpus)
        gpu = resolve_gpu(self.spec, gpu_name)
        device = device_peak_on_gpu(base, gpu)
        engine = colocated_engine_bytes(self.spec, gpu)  # added after the bound, as memory_many adds it
        loaded = self._vram_model
        if loaded is None:
            return int(device * (1 + DEFAULT_UPPER_MARGIN)) + engine
        if self._floor_factor is None:  # the model's upper_floor_bytes, its per-spec factor worked out once
            self._floor_factor = (loaded.model.upper_floor_factor(self.spec),)
        factor = self._floor_factor[0]
        floor = float(resident_bytes(base)) if factor is None else device * factor
        # a hair below the float floor: the bound itself is rounded to whole bytes
        return math.floor(floor * (1 - 1e-9)) + engine

    def required_floor_bytes(self, gpu_name: str | None, gpus: int | None) -> int:
        """Bytes that the memory prediction's :attr:`MemoryPrediction.required_bytes` is never below (the floor of
        :meth:`upper_floor_bytes` with the paged optimizer states' relief of :func:`required_bytes`)."""
        known = self._memory.get((gpu_name, gpus))
        if known is not None:
            return known.required_bytes
        floor = self.upper_floor_bytes(gpu_name, gpus)
        base = self._base(gpus)
        paged = base.breakdown_bytes.get("paged_optimizer_states", 0)
        reclaimable = base.breakdown_bytes.get("allocator_fragmentation", 0)
        if not paged + reclaimable:
            return floor
        if reclaimable and self._vram_model is not None and self._vram_model.model.corrects_point:
            return 0  # a corrected device peak may hold less than the fragmentation and the model states
        # the relief is largest where the device peak is smallest: the paged states (and, with the analytic device
        # peak, the fragmentation) are not corrected, and the rest is at least the resident model states
        reclaim = paged + reclaimable
        return math.floor(floor * (1 - reclaim / max(reclaim + resident_bytes(base), 1)) * (1 - 1e-9))

    def analytic_runtime(self, gpu: GpuSpec, gpus: int | None, interconnect: Interconnect | None
                         ) -> RuntimePrediction:
        """The analytic runtime of the spec on ``gpus`` GPUs of type ``gpu`` (memoised)."""
        key = (gpu.name, gpus, interconnect)
        hit = self._runtimes.get(key)
        if hit is None:
            resolved = self.model
            hit = self._runtimes[key] = predict_runtime(
                self.spec, resolved.architecture, gpu, gpus=gpus, interconnect=interconnect,
                params_override=resolved.params_override, teacher=resolved.teacher_architecture,
                critic=resolved.critic_architecture)
        return hit

    def runtime_floor_seconds(self, gpu_name: str | None, gpus: int | None, interconnect: Interconnect | None
                              ) -> float | None:
        """Seconds that the whole prediction's ``runtime_upper_seconds`` of ``(gpu_name, gpus, interconnect)`` is
        never below, from the analytic runtime alone: cheap, for skipping GPU counts that surely miss a deadline.
        The bound is the runtime times a margin of at least 1 (the fallback's 1 + DEFAULT_RUNTIME_UPPER_MARGIN, or
        the residual's exp(max(width, 0)) over its point), and the point is the analytic runtime unless the runtime
        residual corrects it; ``None`` then, and when there is no GPU or no runtime (no tokens or steps)."""
        gpu = resolve_gpu(self.spec, gpu_name)
        loaded = self._runtime_residual()
        if gpu is None or (loaded is not None and loaded.model.corrects_point):
            return None
        seconds = self.analytic_runtime(gpu, gpus, interconnect).runtime_seconds
        # a hair below: the bound goes through a few more float operations
        return None if seconds is None else seconds * (1 - 1e-9)

    def memory_many(self, requests: Sequence[tuple[str | None, int | None]]) -> list[MemoryPrediction]:
        """The memory prediction of each ``(gpu_name, gpus)``; the new ones in one residual call."""
        memory = self._memory
        missing = list(dict.fromkeys(r for r in requests if r not in memory))
        if missing:
            spec, resolved = self.spec, self.model
            analytic = [self.analytic(gpu_name, gpus) for gpu_name, gpus in missing]
            gpu_specs = [gpu for gpu, _ in analytic]
            vrams = [vram for _, vram in analytic]
            loaded = self._vram_model
            if loaded is None:
                for key, gpu, vram in zip(missing, gpu_specs, vrams, strict=True):
                    upper = int(vram.peak_vram_bytes * (1 + DEFAULT_UPPER_MARGIN))
                    memory[key] = self._with_engine(MemoryPrediction(gpu, vram, upper, {}))
            else:
                from predictors.residual_serving import correct_vram_many

                fixed = correct_vram_many(loaded.model, spec, resolved.architecture,
                                          list(zip(gpu_specs, vrams, strict=True)))
                for key, gpu, f in zip(missing, gpu_specs, fixed, strict=True):
                    extra = {"model_version": loaded.version, "residual_correction_ratio": f.correction_ratio}
                    memory[key] = self._with_engine(MemoryPrediction(gpu, f.vram, f.upper_bytes, extra))
        return [memory[r] for r in requests]

    def _with_engine(self, mem: MemoryPrediction) -> MemoryPrediction:
        """``mem`` with the colocated inference engine's share of its GPU (``colocated_engine_memory_fraction``):
        a setting, so added to the levels and to the bound as it is, after the residual model (which learned the
        training step's error, not the engine's)."""
        fraction = self.spec.colocated_engine_memory_fraction
        if not fraction:
            return mem
        engine = colocated_engine_bytes(self.spec, mem.gpu)
        if not engine:
            note = (f"a colocated inference engine holds {fraction:.0%} of each GPU's memory beside this peak: "
                    "counted once the GPU is known (--gpu, or placement)")
            return replace(mem, vram=replace(mem.vram, notes=(*mem.vram.notes, note)))
        note = (f"a colocated inference engine holds {fraction:.0%} of the {mem.gpu.name if mem.gpu else 'GPU'}'s "
                f"memory ({engine / 2**30:.2f} GiB) through the training step: added to every level and to the bound "
                "as it is")
        vram = with_colocated_engine(mem.vram, engine)
        return replace(mem, vram=replace(vram, notes=(*vram.notes, note)),
                       peak_vram_upper_bytes=mem.peak_vram_upper_bytes + engine)

    def predict_many(self, requests: Sequence[tuple[str | None, int | None, Interconnect | None]]
                     ) -> list[Prediction]:
        """The whole prediction of each ``(gpu_name, gpus, interconnect)``; the new runtimes in one residual call."""
        full = self._full
        missing = list(dict.fromkeys(r for r in requests if r not in full))
        if missing:
            from predictors.residual_serving import runtime_prediction_fields_many

            spec, resolved = self.spec, self.model
            arch = resolved.architecture
            memories = self.memory_many([(gpu_name, gpus) for gpu_name, gpus, _ in missing])
            runtimes: list[RuntimePrediction | None] = []
            timed: list[tuple[GpuSpec, int, RuntimePrediction]] = []
            for (_, gpus, interconnect), mem in zip(missing, memories, strict=True):
                if mem.gpu is None:
                    runtimes.append(None)
                    continue
                runtime = self.analytic_runtime(mem.gpu, gpus, interconnect)
                n_gpus = gpus if gpus is not None else (spec.gpus if isinstance(spec.gpus, int) else 1)
                runtimes.append(runtime)
                timed.append((mem.gpu, n_gpus, runtime))
            fields = iter(runtime_prediction_fields_many(spec, arch, timed,
                                                         self._runtime_residual()))
            for key, mem, runtime in zip(missing, memories, runtimes, strict=True):
                extra = dict(mem.extra)
                if runtime is not None:
                    extra.update(next(fields))
                full[key] = Prediction(spec=spec, model=resolved, gpu=mem.gpu, vram=mem.vram,
                                       peak_vram_upper_bytes=mem.peak_vram_upper_bytes, runtime=runtime, **extra)
        return [full[r] for r in requests]
