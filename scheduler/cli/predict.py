"""``vramfit predict SPEC``: peak VRAM per GPU with its breakdown, and where it fits."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from predictors.errors import SpecError
from predictors.hardware import alias_alternatives, gpu_catalog, lookup_gpu
from predictors.predict import Prediction, predict, reclaimable_bytes, required_bytes
from predictors.spec import MAX_GPUS
from predictors.units import format_bytes
from predictors.vram import colocated_engine_bytes
from scheduler.cli.jsonout import json_text
from scheduler.placement import format_duration
from scheduler.spec import read_jobs
from scheduler.spec.document import ParsedJob, answer_each


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("predict", help="predict peak VRAM (and runtime with --gpu) of a training spec or job")
    p.add_argument("spec", help="TrainingSpec YAML/JSON, or a job manifest (Kubernetes, Ray); - reads standard input")
    p.add_argument("--gpu", help="GPU type to predict for (overrides spec.gpu), e.g. A100-80GB")
    p.add_argument("--gpus", type=int, help="GPU count (overrides spec.gpus; needed for gpus: auto)")
    p.add_argument("--runtime", action="append", default=[], metavar="FILE",
                   help="a file with the (Cluster)TrainingRuntime a TrainJob references (repeatable)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--timing", action="store_true", help="print the compute time per prediction to stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.gpus is not None and args.gpus < 1:
        raise SpecError.one("--gpus", f"must be a positive integer; got {args.gpus}")
    if args.gpus is not None and args.gpus > MAX_GPUS:  # as spec.gpus; 10^400 was an OverflowError traceback
        got = f"{args.gpus:,}" if args.gpus < 10**20 else f"a number of {len(str(args.gpus))} digits"
        raise SpecError.one("--gpus", f"must be at most {MAX_GPUS:,}, as spec.gpus; got {got}")
    if args.gpu is not None:
        lookup_gpu(args.gpu, "--gpu")  # a bad flag is the flag's error, not the spec file's
    jobs = read_jobs(args.spec, args.runtime)

    def timed(job: ParsedJob) -> tuple[Prediction, float]:
        started = time.perf_counter()
        pred = predict(job.spec, gpu_name=args.gpu, gpus=args.gpus, base_dir=job.base_dir)
        elapsed_ms = (time.perf_counter() - started) * 1000
        if pred.gpu is not None and not pred.gpu.runs(job.spec.precision):
            print(f"vramfit: warning: {pred.gpu.name} has no bf16: {job.spec.precision} cannot run there (its "
                  f"runtime here is at the fp16 peak); use {job.spec.precision.replace('bf16', '16')}",
                  file=sys.stderr)
        requested = args.gpu or job.spec.gpu
        if pred.gpu is not None and requested and (others := alias_alternatives(requested)):
            print(f"vramfit: warning: GPU {requested!r} read as {pred.gpu.name}; the catalog also has "
                  f"{', '.join(others)}: name the card to be sure", file=sys.stderr)
        if pred.gpu is not None and (verdict := fit_verdict(pred)):
            print(f"vramfit: warning: {verdict}", file=sys.stderr)
        return pred, elapsed_ms

    answers = answer_each(jobs, args.spec if args.spec != "-" else "<stdin>", timed)
    outputs: list[dict[str, Any]] = []
    for job, (pred, elapsed_ms) in zip(jobs, answers, strict=True):
        # the contract's fields, then the extensions: the level each breakdown component counts in, the runtime's parts
        out = {**pred.to_dict(), **pred.level_explanation(), **pred.runtime_explanation()}
        if len(jobs) > 1 or job.kind != "TrainingSpec":
            # a plain TrainingSpec of a multi-document file is named by its document, as in the error messages
            out["job"] = job.label
        if job.assumptions:
            out["assumptions"] = list(job.assumptions)
        outputs.append(out)
        if args.format == "table":
            print(render_table(pred, job.ref if job.kind != "TrainingSpec" else ""))
            if job.assumptions:
                print("Assumed: " + "; ".join(job.assumptions))
        if args.timing:
            print(f"predict compute time: {elapsed_ms:.2f} ms", file=sys.stderr)
    if args.format == "json":
        print(json_text(outputs[0] if len(outputs) == 1 else outputs))
    return 0


def fit_verdict(pred: Prediction) -> str:
    """Why the job may not fit the GPU it was predicted for ('' when it fits under the upper bound)."""
    gpu = pred.gpu
    if gpu is None:
        return ""
    v = pred.vram
    paged = v.breakdown_bytes.get("paged_optimizer_states", 0)
    cache = int(reclaimable_bytes(v))  # the allocator's fragmentation: freed and retried before an allocation fails
    # paged optimizer states move to host memory when the GPU is full
    resident = v.peak_vram_bytes - paged - cache
    needed = required_bytes(pred.peak_vram_upper_bytes, v)
    memory = gpu.memory_bytes
    if resident > memory:
        without = " and ".join(w for w, n in (("the paged optimizer states", paged),
                                                ("the allocator's fragmentation", cache)) if n)
        return (f"does not fit on {gpu.name}: the expected peak {format_bytes(resident)} per GPU"
                + (f" without {without}" if without else "") + f" is above its {format_bytes(memory)}")
    # the prediction on a named GPU cuts the cache to the room there (vram.on_gpu): a peak at the card's memory is
    # a cache that would grow further with room
    if cache and v.peak_vram_bytes - paged >= memory and needed <= memory:
        return (f"fits on {gpu.name}, with the allocator's cache of variable-length blocks filling the rest of its "
                f"memory ({format_bytes(cache)}): PyTorch frees cached blocks and retries when the GPU is full, "
                "slower steps; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True avoids the fragmentation")
    # paged states that must page: the peak with them resident (less the cache, which is freed first) is above
    if paged and v.peak_vram_bytes - cache > memory:
        return (f"fits on {gpu.name} only with the paged optimizer states ({format_bytes(paged)}) partly in host "
                f"memory: the driver pages them over PCIe at every step, slower than the runtime shown")
    if needed > memory:
        expected = v.peak_vram_bytes - cache
        return (f"may not fit on {gpu.name}: the upper bound {format_bytes(needed)} per GPU is above its "
                f"{format_bytes(memory)} (the expected peak {format_bytes(expected)} is "
                + ("below" if expected <= memory else "above it with the paged optimizer states resident")
                + (", without the allocator's fragmentation" if cache else "") + ")")
    return ""


def render_table(pred: Prediction, title: str = "") -> str:
    v = pred.vram
    lines = []
    head = f"{title}: " if title else ""
    lines.append(f"{head}{pred.model.label}  params {v.params_total:,} (trainable {v.params_trainable:,})  "
                 f"gpus {v.gpus}  peak at {v.peak_phase.replace('_', ' ')}")
    total = v.peak_vram_bytes
    lines.append(f"  {'component':28s} {'bytes':>16s} {'':>12s} {'share':>6s}")
    for name, n_bytes in sorted(v.breakdown_bytes.items(), key=lambda kv: -kv[1]):
        share = n_bytes / total * 100 if total else 0.0
        lines.append(f"  {name:28s} {n_bytes:>16,d} {format_bytes(n_bytes):>12s} {share:5.1f}%")
    totals = (
        ("peak allocated (tensors)", v.peak_allocated_bytes),
        ("peak reserved (allocator)", v.peak_reserved_bytes),
        ("peak device (nvidia-smi)", total),
        ("upper bound (placement)", pred.peak_vram_upper_bytes),
    )
    for label, n_bytes in totals:
        lines.append(f"  {label:28s} {n_bytes:>16,d} {format_bytes(n_bytes):>12s}")
    if pred.throughput_tokens_per_second is not None and pred.gpu is not None:
        lines.append(f"  throughput on {pred.gpu.name}: {pred.throughput_tokens_per_second:,.0f} tokens/s")
    if pred.runtime is not None:
        rt = pred.runtime
        parts, overlapped = rt.step_breakdown()
        shown = ", ".join(f"{name} {_seconds(t)}" for name, t in sorted(parts.items(), key=lambda kv: -kv[1]))
        lines.append(f"  step: {_seconds(rt.step_time_seconds)} for {rt.tokens_per_step:,.0f} tokens = {shown}")
        if overlapped:
            lines.append("    under it: " + ", ".join(f"{name} {_seconds(t)}" for name, t in overlapped.items()))
        if pred.runtime_correction_ratio not in (None, 1.0):
            lines.append(f"    x {pred.runtime_correction_ratio:.3f} throughput by the runtime residual")
    if pred.runtime_seconds is not None:
        upper = (f" (upper bound {format_duration(pred.runtime_upper_seconds)})"
                 if pred.runtime_upper_seconds is not None else "")
        lines.append(f"  runtime: {format_duration(pred.runtime_seconds)}{upper}")
    # paged optimizer states without the margin; a colocated engine's share is each GPU's own
    needed = required_bytes(pred.peak_vram_upper_bytes, v) - v.breakdown_bytes.get("colocated_engine", 0)
    fits = [g.name for g in gpu_catalog().values()
            if needed + colocated_engine_bytes(pred.spec, g) <= g.memory_bytes and g.runs(pred.spec.precision)]
    lines.append("  fits on: " + (", ".join(fits) if fits else "no single catalog GPU (shard it or change the method)"))
    for note in v.notes:
        lines.append(f"  note: {note}")
    for note in pred.runtime.notes if pred.runtime is not None else ():
        lines.append(f"  note (runtime): {note}")
    return "\n".join(lines)


def _seconds(t: float) -> str:
    """A step part: milliseconds below a second, else seconds."""
    return f"{t * 1000:.1f} ms" if t < 1 else f"{t:.2f} s"
