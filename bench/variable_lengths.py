"""Does a job whose micro-batches vary in length reserve more GPU memory than one padded to max_length?

The later ms-swift benchmark runs (bench/data/external_runs_2.jsonl, source X06) read 5-8.5 GiB more peak reserved
memory than vramfit's fixed-length prediction, about the same excess for 1.8B, 7B and 14B models at a given
max_length, in runs whose samples vary in length below max_length over thousands of steps. The caching allocator's
fragmentation of length-sized blocks would do that; this bench measures it on a real GPU. Each config runs three
ways, in separate processes (each has its own caching allocator), the same micro-batches in the same order:

  fixed                every micro-batch padded to max_length (what a TrainingSpec's seq_len describes)
  variable             each micro-batch as long as its sample (a collator that pads to the longest in the batch)
  variable-expandable  the same, with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

Sample lengths follow the ms-swift runs' dataset (cls-fudan-news-zh in Qwen tokens: mean 3,234.4, standard
deviation 2,547.5, minimum 91, as the X06 rows' notes quote ms-swift's benchmark page), drawn from a gamma
distribution with that mean and deviation, samples longer than max_length dropped as ms-swift drops them.

  python bench/variable_lengths.py --out rows.jsonl --budget-seconds 400     # the plan below, on cuda:0
  python bench/variable_lengths.py --worker '{"model": "gpt2", ...}'         # one run (the driver's child)

Each row: the config, the mode, the micro-batches run, and torch's peak allocated and reserved bytes, with the
reserved peak after 1, 16, 64, ... micro-batches and the allocator's retry count (a retry means the process hit the
device's limit and freed its cache, which would make the reserved figure a floor, not a peak).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# The X06 dataset's token lengths (ms-swift docs/source/LLM/Benchmark.md @145bf083, quoted in the X06 rows' notes)
SAMPLE_MEAN_TOKENS = 3234.4
SAMPLE_STD_TOKENS = 2547.5
SAMPLE_MIN_TOKENS = 91
MODES = ("fixed", "variable", "variable-expandable")
EXPANDABLE = "expandable_segments:True"
TRAJECTORY_POINTS = (1, 16, 32, 64, 128, 256, 512, 1024, 2048)

# ms-swift's benchmark settings (X06 notes): LoRA rank 8 on the attention's q/k/v (Qwen-1's fused c_attn), alpha 32,
# dropout 0.05, bf16, batch size 1, gradient accumulation 16, gradient checkpointing, flash attention (sdpa here).
BASE_SPEC: dict[str, Any] = {
    "task": "causal-lm", "method": "lora", "precision": "bf16-true", "optimizer": "adamw", "micro_batch_size": 1,
    "grad_accum_steps": 16, "gradient_checkpointing": "full", "attention": "sdpa", "gpus": 1,
    "lora": {"rank": 8, "alpha": 32, "dropout": 0.05, "target_modules": ["q_proj", "k_proj", "v_proj"]},
}
# (model, max_length, micro-batches, the modes run side by side): most informative first. Qwen2.5 stands in for
# Qwen-1 (same 151,936-token vocabulary; transformers implements it natively). Two 7B processes at a time.
PLAN: tuple[tuple[str, int, int, tuple[str, ...]], ...] = (
    ("qwen2.5-1.5b", 2048, 480, MODES),
    ("qwen2.5-7b", 2048, 192, ("fixed", "variable")),
    ("qwen2.5-1.5b", 4096, 320, MODES),
    ("qwen2.5-1.5b", 1024, 480, MODES),
    ("qwen2.5-7b", 2048, 192, ("variable-expandable",)),
    ("qwen2.5-7b", 4096, 160, ("fixed", "variable")),
)
# A check of the bench itself on a CPU (no allocator figures): two micro-batches of the smallest Qwen.
SMOKE_PLAN: tuple[tuple[str, int, int, tuple[str, ...]], ...] = (("qwen2.5-0.5b", 128, 2, MODES),)


def sample_lengths(max_length: int, count: int, seed: int = 0) -> list[int]:
    """``count`` sample lengths in tokens, the dataset's distribution with samples over ``max_length`` dropped."""
    shape = (SAMPLE_MEAN_TOKENS / SAMPLE_STD_TOKENS) ** 2
    scale = SAMPLE_STD_TOKENS ** 2 / SAMPLE_MEAN_TOKENS
    rng = random.Random(seed)
    lengths: list[int] = []
    while len(lengths) < count:
        length = round(rng.gammavariate(shape, scale))
        if SAMPLE_MIN_TOKENS <= length <= max_length:
            lengths.append(length)
    return lengths


def run_worker(job: dict[str, Any]) -> dict[str, Any]:
    """One process, one mode: build the model, run the micro-batches, report the allocator's peaks."""
    import torch

    from predictors.spec import parse_training_spec
    from scheduler.calibrate import worker

    started = time.monotonic()
    transformers = worker._import("transformers")
    spec = parse_training_spec({**BASE_SPEC, "model": job["model"], "seq_len": job["max_length"]})
    device = worker._pick_device(torch, job.get("device", "cuda"))
    on_cuda = device.type == "cuda"
    torch.manual_seed(0)
    model = worker._build_model(torch, transformers, spec, worker.model_config_of(spec), device, None)
    worker._enable_checkpointing(model, spec)
    model, _ = worker._apply_lora(torch, model, spec)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = worker._optimizer(torch, transformers, spec, params)
    vocab = int(model.config.vocab_size)
    lengths = sample_lengths(spec.seq_len, int(job["micro_batches"]))
    if job["mode"] == "fixed":
        lengths = [spec.seq_len] * len(lengths)
    generator = torch.Generator(device="cpu").manual_seed(1)
    if on_cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    trajectory: list[dict[str, int]] = []
    deadline = started + float(job.get("time_limit_seconds", 1e9))
    run = 0
    tokens = 0
    for index, length in enumerate(lengths, start=1):
        ids = torch.randint(0, vocab, (1, length), generator=generator).to(device)
        loss = model(input_ids=ids, labels=ids).loss / spec.grad_accum_steps  # bf16-true: no autocast
        loss.backward()
        if index % spec.grad_accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        run, tokens = index, tokens + length
        if on_cuda and index in TRAJECTORY_POINTS:
            trajectory.append({"micro_batches": index,
                               "peak_reserved_bytes": int(torch.cuda.max_memory_reserved(device)),
                               "peak_allocated_bytes": int(torch.cuda.max_memory_allocated(device))})
        if time.monotonic() > deadline:
            break
    if on_cuda:
        torch.cuda.synchronize(device)
    row: dict[str, Any] = {
        "model": job["model"], "max_length": spec.seq_len, "mode": job["mode"], "micro_batches": run,
        "micro_batches_planned": len(lengths), "tokens": tokens, "mean_length": tokens / max(run, 1),
        "longest_length": max(lengths[:run]), "seconds": round(time.monotonic() - started, 1),
        "spec": {**BASE_SPEC, "model": job["model"], "seq_len": spec.seq_len},
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "environment": worker.environment(torch, device), "packages": worker.package_versions(),
    }
    if on_cuda:
        stats = torch.cuda.memory_stats(device)
        row.update(peak_allocated_bytes=int(torch.cuda.max_memory_allocated(device)),
                   peak_reserved_bytes=int(torch.cuda.max_memory_reserved(device)),
                   reserved_at_end_bytes=int(torch.cuda.memory_reserved(device)),
                   num_alloc_retries=int(stats.get("num_alloc_retries", 0)), num_ooms=int(stats.get("num_ooms", 0)),
                   segments_peak=int(stats.get("segment.all.peak", 0)),
                   inactive_split_peak_bytes=int(stats.get("inactive_split_bytes.all.peak", 0)),
                   trajectory=trajectory)
    return row


def _launch(model: str, max_length: int, micro_batches: int, mode: str, time_limit_seconds: float,
            device: str) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if mode == "variable-expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = EXPANDABLE
    job = {"model": model, "max_length": max_length, "micro_batches": micro_batches, "mode": mode,
           "time_limit_seconds": time_limit_seconds, "device": device}
    return subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(job)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def drive(out: Path, budget_seconds: float, device: str, plan: Sequence[tuple[str, int, int, tuple[str, ...]]]) -> int:
    """Run the plan's configs one after another (a config's modes side by side), appending rows to ``out``."""
    start = time.monotonic()
    written = 0
    for model, max_length, micro_batches, modes in plan:
        left = budget_seconds - (time.monotonic() - start)
        if left < 60:
            print(f"budget spent: {model} at {max_length} not run", flush=True)
            break
        # a run stops after its time limit and reports what it ran; the kill is for a hung process
        limit = min(left - 20, 240.0)
        procs = {mode: _launch(model, max_length, micro_batches, mode, limit - 30, device) for mode in modes}
        kill_at = time.monotonic() + limit
        for mode, proc in procs.items():
            try:
                stdout, stderr = proc.communicate(timeout=max(kill_at - time.monotonic(), 1.0))
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, stderr = proc.communicate()
            line = next((x for x in reversed(stdout.splitlines()) if x.startswith("{")), None)
            row = json.loads(line) if line and proc.returncode == 0 else {
                "model": model, "max_length": max_length, "mode": mode, "outcome": "crash",
                "reason": "\n".join(stderr.strip().splitlines()[-8:]) or f"exit status {proc.returncode}"}
            row.setdefault("outcome", "ok")
            with out.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(row) + "\n")
            written += 1
            gib = {k: round(row[k] / 2**30, 2) for k in ("peak_allocated_bytes", "peak_reserved_bytes") if k in row}
            print(f"{model} {max_length} {mode}: {row['outcome']} {gib} mb={row.get('micro_batches')} "
                  f"retries={row.get('num_alloc_retries')} {row.get('seconds')} s "
                  f"{row.get('reason', '') or ''}"[:900], flush=True)
    print(f"{written} rows in {time.monotonic() - start:.0f} s", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help="one run's job as JSON (the driver's child process)")
    parser.add_argument("--out", type=Path, default=Path("variable-lengths.jsonl"))
    parser.add_argument("--budget-seconds", type=float, default=400.0)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--smoke", action="store_true", help="the bench's own check: a tiny plan (runs on a CPU)")
    parser.add_argument("--config", action="append", default=[], metavar="MODEL:MAX_LENGTH:MICRO_BATCHES:MODE,...",
                        help="run these configs instead of the plan (repeatable)")
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(run_worker(json.loads(args.worker))), flush=True)
        return 0
    if not math.isfinite(args.budget_seconds) or args.budget_seconds <= 0:
        parser.error("--budget-seconds must be a positive number")
        plan = SMOKE_PLAN if args.smoke else PLAN
    if args.config:
        plan = tuple(_parse_config(parser, text) for text in args.config)
    return drive(args.out, args.budget_seconds, args.device, plan)


def _parse_config(parser: argparse.ArgumentParser, text: str) -> tuple[str, int, int, tuple[str, ...]]:
    parts = text.split(":")
    if len(parts) != 4 or not parts[1].isdigit() or not parts[2].isdigit():
        parser.error(f"--config {text!r}: expected MODEL:MAX_LENGTH:MICRO_BATCHES:MODE,... (e.g. qwen2.5-7b:2048:128:"
                     "fixed,variable)")
    modes = tuple(parts[3].split(","))
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"--config {text!r}: unknown mode {unknown[0]!r} (modes: {', '.join(MODES)})")
    return parts[0], int(parts[1]), int(parts[2]), modes


if __name__ == "__main__":
    sys.exit(main())
