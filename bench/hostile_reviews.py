"""Worst-case admission reviews: how long the review function takes on hostile objects that fit the body cap.

The webhook refuses bodies above ``MAX_BODY_BYTES`` (8 MiB) before parsing; everything below it reaches
``admission.review``. Each case here builds a Pod whose review body is close to that cap and shaped to hit
one parser path (a long YAML annotation, a huge command line, many env vars or containers, shell text with
unclosed ``${``, a very long model name that the closest-name hint compares, a YAML alias bomb), then times
one ``/validate`` review in-process and prints the body size, the time and the outcome.

    python bench/hostile_reviews.py [--mib 8] [--only NAME]

A review that takes seconds here holds a server worker that long; the API server's webhook timeout (10 s
by default, 30 s at most) then answers by the failure policy.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scheduler.integrations.admission import review  # noqa: E402
from scheduler.integrations.webhook import MAX_BODY_BYTES  # noqa: E402
from scheduler.pools import parse_pools  # noqa: E402
from scheduler.spec.yamltext import MAX_EMBEDDED_CHARS  # noqa: E402
from tests.integrations.manifests import ALIAS_BOMB, admission_review, pod  # noqa: E402

POOLS = parse_pools({"pools": [
    {"name": "l40s", "gpu": "L40S", "gpus_per_node": 8, "nodes": 4, "price_usd_per_gpu_hour": 1.45},
    {"name": "h100", "gpu": "H100-80GB", "gpus_per_node": 8, "nodes": 4, "price_usd_per_gpu_hour": 2.99},
]})
SPEC = "model: llama-3.2-1b\nmethod: lora\nprecision: bf16-true\n"


def _pod(spec: str = SPEC, **container: Any) -> dict[str, Any]:
    obj = pod(spec=spec)
    obj["spec"]["containers"][0].update(container)
    return obj


def cases(budget_bytes: int) -> dict[str, Callable[[], dict[str, Any]]]:
    """Name -> builder of a Pod whose review body is a little under ``budget_bytes``."""
    n = budget_bytes
    cap = MAX_EMBEDDED_CHARS
    return {
        "annotation: long flow list": lambda: _pod(SPEC + "x: [" + "1," * (n // 2 - 64) + "1]\n"),
        "annotation: flow list at the cap": lambda: _pod(SPEC + "x: [" + "1," * (cap // 2 - 64) + "1]\n"),
        "annotation: many keys": lambda: _pod(SPEC + "".join(f"k{i}: {i}\n" for i in range(n // 17))),
        "annotation: long model name": lambda: _pod("model: " + "a" * (n - 200) + "\n"),
        "annotation: alias bomb": lambda: _pod(SPEC + ALIAS_BOMB),
        "command: one long argument": lambda: _pod(command=["python", "train.py", "--model_name_or_path",
                                                            "x" * (n - 300)]),
        "command: many flags": lambda: _pod(command=["torchrun", "train.py", *["--lr=1"] * (n // 10)]),
        "command: shell, unclosed ${": lambda: _pod(command=["bash", "-c", "${a:-" * (n // 6)]),
        "command: shell at the cap, one word": lambda: _pod(command=["bash", "-c", "x" * (cap - 10)]),
        "command: shell, many lines": lambda: _pod(command=["bash", "-c", "export A=1\n" * (n // 12)]),
        "command: shell, heredocs": lambda: _pod(command=["bash", "-c", "cat <<EOF > c.yaml\nx: 1\n" * (n // 26)]),
        "env: many variables": lambda: _pod(env=[{"name": f"V{i}", "value": "1"} for i in range(n // 35)]),
        "env: one inline config": lambda: _pod(env=[{"name": "CFG", "value": "base_model: x\n" + "a: 1\n" * (n // 7)}]),
        "containers: many, inline configs": lambda: {**_pod(), "spec": {"containers": [
            {"name": f"c{i}", "image": "i", "resources": {"limits": {"nvidia.com/gpu": 1}},
             "env": [{"name": "CFG", "value": "{x: [" + "1," * (cap // 2 - 16) + "1]}"}]}
            for i in range(n // (cap + 200))]}},
        "command: heredoc config named 800 times": lambda: _pod(command=["bash", "-c", (
            "cat > /tmp/c.yaml <<EOF\nmodel_name_or_path: x\nx: [" + "1," * (cap // 5) + "1]\nEOF\n"
            + "llamafactory-cli train /tmp/c.yaml\n" * 800)]),
        "containers: many": lambda: {**_pod(), "spec": {"containers": [
            {"name": f"c{i}", "image": "i", "resources": {"limits": {"nvidia.com/gpu": 1}}} for i in range(n // 84)]}},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=MAX_BODY_BYTES / 2**20, help="body size to aim for (MiB)")
    parser.add_argument("--only", default="", help="run the cases whose name contains this text")
    args = parser.parse_args(argv)
    now = datetime.now(timezone.utc)
    review(admission_review(pod()), None, POOLS, now, webhook="validate")  # warm the catalogs
    print(f"{'case':36} {'body':>9} {'seconds':>8}  outcome")
    worst = 0.0
    for name, build in cases(int(args.mib * 2**20)).items():
        if args.only not in name:
            continue
        request = admission_review(build())
        size = len(json.dumps(request))
        start = time.perf_counter()
        answer = review(request, None, POOLS, now, webhook="validate")["response"]
        seconds = time.perf_counter() - start
        worst = max(worst, seconds)
        text = (answer.get("warnings") or [answer.get("status", {}).get("message", "placed")])[0]
        outcome = ("allowed" if answer["allowed"] else "denied") + ": " + text[:70].replace("\n", " ")
        print(f"{name:36} {size / 2**20:7.2f}Mi {seconds:8.3f}  {outcome}")
    print(f"worst review: {worst:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
