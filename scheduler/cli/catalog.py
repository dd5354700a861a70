"""``vramfit models`` and ``vramfit gpus``: list the catalogs."""

from __future__ import annotations

import argparse
import json

from predictors.architecture import architecture_from_config
from predictors.catalog import catalog
from predictors.hardware import gpu_catalog
from predictors.units import GIB


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    models = sub.add_parser("models", help="list the model catalog with parameter counts")
    models.add_argument("--format", choices=("table", "json"), default="table")
    models.set_defaults(func=_models)
    gpus = sub.add_parser("gpus", help="list the GPU catalog")
    gpus.add_argument("--format", choices=("table", "json"), default="table")
    gpus.set_defaults(func=_gpus)


def _models(args: argparse.Namespace) -> int:
    rows = []
    for name, entry in catalog().items():
        arch = architecture_from_config(entry.config, name)
        rows.append({"name": name, "model_type": arch.model_type, "params_total": arch.params_total,
                     "layers": arch.num_layers, "hidden_size": arch.hidden_size, "vocab_size": arch.vocab_size,
                     "hf_ids": list(entry.hf_ids)})
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'model':30s} {'type':12s} {'params':>16s} {'layers':>6s} {'hidden':>6s}  hf id")
    for r in rows:
        print(f"{r['name']:30s} {r['model_type']:12s} {r['params_total']:>16,d} {r['layers']:>6d} "
              f"{r['hidden_size']:>6d}  {', '.join(r['hf_ids'])}")
    return 0


def _gpus(args: argparse.Namespace) -> int:
    gpus = list(gpu_catalog().values())
    if args.format == "json":
        print(json.dumps([g.model_dump(mode="json") for g in gpus], indent=2))
        return 0
    name_width = max(len("gpu"), *(len(g.name) for g in gpus))  # the longest name, e.g. A100-80GB-PCIe
    family_width = max(len("family"), *(len(g.family) for g in gpus))
    print(f"{'gpu':{name_width}s} {'family':{family_width}s} {'memory':>10s} {'bf16 TFLOP/s':>13s} {'HBM TB/s':>9s} "
          f"{'NVLink GB/s':>12s}")
    for g in gpus:
        bf16 = f"{(g.bf16_dense_flops or 0) / 1e12:.0f}" if g.bf16_dense_flops else "-"
        nv = f"{g.nvlink_bytes_per_second / 1e9:.0f}" if g.nvlink_bytes_per_second else "PCIe"
        print(f"{g.name:{name_width}s} {g.family:{family_width}s} {g.memory_bytes / GIB:>9.1f}G {bf16:>13s} "
              f"{g.memory_bandwidth_bytes_per_second / 1e12:>9.2f} {nv:>12s}")
    return 0
