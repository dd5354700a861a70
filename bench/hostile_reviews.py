"""Worst-case admission reviews: how long the review function takes on hostile objects that fit the body cap.

The webhook refuses bodies above ``MAX_BODY_BYTES`` (8 MiB) before parsing; everything below it reaches
``admission.review``. Each case here builds a Pod whose review body is close to that cap and shaped to hit
one parser path (a long YAML annotation, a huge command line, many env vars or containers, shell text with
unclosed ``${``, a very long model name that the closest-name hint compares, a YAML alias bomb), then times
one ``/validate`` review in-process and prints the body size, the time and the outcome.

    python bench/hostile_reviews.py [--mib 8] [--only NAME]
    python bench/hostile_reviews.py --server [--attackers 2] [--seconds 10]

A review that takes seconds here holds a server worker that long; the API server's webhook timeout (10 s
by default, 30 s at most) then answers by the failure policy. ``--server`` starts ``vramfit serve`` on
127.0.0.1 and measures what other clients see meanwhile: ``/healthz`` and a normal ``/mutate`` latency while
``--attackers`` clients post the slowest case back to back, against the same figures with no attack.
"""

from __future__ import annotations

import argparse
import collections
import json
import ssl
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scheduler.integrations.admission import review  # noqa: E402
from scheduler.integrations.webhook import MAX_BODY_BYTES  # noqa: E402
from scheduler.pools import parse_pools  # noqa: E402
from scheduler.spec.yamltext import MAX_EMBEDDED_CHARS  # noqa: E402
from tests.integrations.certs import make_ca, write_server_pair  # noqa: E402
from tests.integrations.manifests import ALIAS_BOMB, admission_review, pod  # noqa: E402
from tests.integrations.processes import wait_until  # noqa: E402
from tests.integrations.serving import free_port, ready, start_webhook, stop  # noqa: E402

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
        "command: shell, exponential exports": lambda: _pod(command=["bash", "-c", "\n".join(
            ["export L0=xxxxxxxxxx", *(f"export L{i}=" + f"$L{i - 1}" * 10 for i in range(1, 10)), "train $L9"])]),
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
        "containers: exponential $(VAR)": lambda: {**_pod(), "spec": {"containers": [
            {"name": f"c{i}", "image": "i", "args": ["$(L4)"] * 100,
             "env": [{"name": "L0", "value": "x" * 10}, *({"name": f"L{j}", "value": f"$(L{j - 1})" * 10}
                                                          for j in range(1, 10))]}
            for i in range(n // 2_200)]}},
        # session 28's new shell handling: a script's $@ bound to its arguments, arithmetic, nested defaults
        "command: bash -c of 8 MiB of $@": lambda: _pod(command=["bash", "-c", "$@" * (n // 2 - 100), "_", "a", "b"]),
        "command: one $@, 8 MiB of arguments": lambda: _pod(command=["bash", "-c", "torchrun train.py $@", "_",
                                                                     *(["a"] * (n // 6))]),
        "command: arithmetic with variables at the cap": lambda: _pod(command=[
            "bash", "-c", "export A=7\nexport B=9\necho " + "$((A*B+A)) " * ((cap - 40) // 11)]),
        "command: nested defaults at the cap": lambda: _pod(command=[
            "bash", "-c", "export B=" + "b" * 200 + "\necho " + "${A:-${B}} " * ((cap - 260) // 11)]),
        "command: an array doubled 40 times": lambda: _pod(command=[
            "bash", "-c", "A=(--x y)\n" + 'A+=("${A[@]}" "${A[@]}")\n' * 40 + "torchrun pretrain_gpt.py ${A[@]}"]),
        "command: if branches at the cap": lambda: _pod(command=[
            "bash", "-c", ('if [ "$A" = b ] || [ $B = c ]; then\nX=1\nelif [ -z "$X" ]; then\nY=2\nfi\n')
            * ((cap - 100) // 70)]),
        "containers: many": lambda: {**_pod(), "spec": {"containers": [
            {"name": f"c{i}", "image": "i", "resources": {"limits": {"nvidia.com/gpu": 1}}} for i in range(n // 84)]}},
    }


def _latencies_ms(url: str, context: ssl.SSLContext, path: str, body: bytes | None, count: int) -> list[float]:
    out = []
    with httpx.Client(base_url=url, verify=context, timeout=120) as client:
        for _ in range(count):
            start = time.perf_counter()
            if body is None:
                client.get(path)
            else:
                client.post(path, content=body, headers={"content-type": "application/json"})
            out.append((time.perf_counter() - start) * 1000)
            time.sleep(0.05)
    return out


def serve_under_attack(attackers: int, seconds: float, case: str) -> None:
    """Latency of /healthz and a normal /mutate with and without ``attackers`` clients posting ``case``."""
    directory = Path(tempfile.mkdtemp(prefix="vramfit-hostile-"))
    ca = make_ca()
    (directory / "ca.crt").write_bytes(ca.pem())
    write_server_pair(ca, directory)
    port = free_port()
    process, log_path = start_webhook(directory, port, ["--log-level", "warning"])
    context = ssl.create_default_context(cafile=str(directory / "ca.crt"))
    url = f"https://127.0.0.1:{port}"
    hostile = json.dumps(admission_review(cases(MAX_BODY_BYTES - 64 * 1024)[case]())).encode()
    normal = json.dumps(admission_review(pod())).encode()
    stop_attack = threading.Event()
    hostile_ms: list[float] = []
    statuses: collections.Counter[int] = collections.Counter()

    def attack() -> None:
        with httpx.Client(base_url=url, verify=context, timeout=120) as client:
            while not stop_attack.is_set():
                start = time.perf_counter()
                reply = client.post("/validate", content=hostile, headers={"content-type": "application/json"})
                statuses[reply.status_code] += 1
                if reply.status_code == 200:
                    hostile_ms.append((time.perf_counter() - start) * 1000)
                else:
                    time.sleep(0.05)  # a 503 says retry; a client that retries at once only measures its own loop

    try:
        wait_until(lambda: ready(url, process, log_path, verify=context), 60, "the webhook's /readyz")
        count = max(10, int(seconds / 2 / 0.06))
        quiet = {path: _latencies_ms(url, context, path, body, count)
                 for path, body in (("/healthz", None), ("/mutate", normal))}
        threads = [threading.Thread(target=attack, daemon=True) for _ in range(attackers)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        loud = {path: _latencies_ms(url, context, path, body, count)
                for path, body in (("/healthz", None), ("/mutate", normal))}
        stop_attack.set()
        for thread in threads:
            thread.join()
        peak_rss = _peak_rss_mib(process.pid)
    finally:
        stop(process)

    def figures(values: list[float]) -> str:
        ordered = sorted(values)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        return f"p50 {statistics.median(values):7.1f} ms  p99 {p99:7.1f} ms  max {max(values):7.1f} ms"

    print(f"hostile case {case!r}, {len(hostile) / 2**20:.2f} MiB, {attackers} clients back to back")
    for path in ("/healthz", "/mutate"):
        print(f"{path:9} quiet        {figures(quiet[path])}")
        print(f"{path:9} under attack {figures(loud[path])}")
    answered = ", ".join(f"{count} x HTTP {code}" for code, count in sorted(statuses.items()))
    print(f"hostile   {answered}; the 200s: {figures(hostile_ms) if hostile_ms else 'none'}")
    print(f"server peak RSS: {peak_rss}")


def _peak_rss_mib(pid: int) -> str:
    """The process's peak resident memory (VmHWM), where /proc has it."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return f"{int(line.split()[1]) / 1024:.0f} MiB"
    except OSError:
        pass
    return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=MAX_BODY_BYTES / 2**20, help="body size to aim for (MiB)")
    parser.add_argument("--only", default="", help="run the cases whose name contains this text")
    parser.add_argument("--server", action="store_true", help="measure a running server under attack instead")
    parser.add_argument("--attackers", type=int, default=2, help="--server: clients posting the hostile case")
    parser.add_argument("--seconds", type=float, default=10.0, help="--server: about how long each phase runs")
    parser.add_argument("--case", default="containers: many, inline configs", help="--server: the hostile case")
    args = parser.parse_args(argv)
    if args.server:
        serve_under_attack(args.attackers, args.seconds, args.case)
        return 0
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
