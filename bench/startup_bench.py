"""Wall time and peak memory of whole `vramfit predict` / `vramfit place` processes (start-up included).

Usage: python bench/startup_bench.py [--runs N] [SPEC]   (default: examples/llama-3.1-8b-lora.yaml, 5 runs)
Each run is a fresh ``python -m scheduler.cli`` process; prints min / median / max seconds, the peak resident
memory (ru_maxrss of the child), and which heavy libraries the process imported (none expected: the shipped
residual models are applied from their serving files, without scikit-learn, skops or scipy).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("sklearn", "skops", "scipy", "torch", "pandas")
# run the CLI, then report the heavy top-level packages it imported (on stderr, after the command's output)
_PROBE = ("import sys\nfrom scheduler.cli import main\ncode = main(sys.argv[1:])\n"
          f"print('heavy:', sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})), file=sys.stderr)\n"
          "raise SystemExit(code)\n")


def _one(args: list[str]) -> tuple[float, float, str]:
    """Seconds, peak MiB and the heavy-import line of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _PROBE, *args], cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"vramfit {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the largest child so far
    heavy = next((line for line in done.stderr.splitlines() if line.startswith("heavy:")), "heavy: ?")
    return seconds, max(peak_kib, before) / 1024, heavy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("spec", nargs="?", default=str(REPO / "examples" / "llama-3.1-8b-lora.yaml"))
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    print(f"{'command':10s} {'min s':>7s} {'median s':>9s} {'max s':>7s} {'peak MiB':>9s}  imported")
    for command in (["predict", args.spec], ["place", args.spec]):
        results = [_one(command) for _ in range(args.runs)]
        seconds = [s for s, _, _ in results]
        print(f"{command[0]:10s} {min(seconds):7.2f} {statistics.median(seconds):9.2f} {max(seconds):7.2f} "
              f"{max(m for _, m, _ in results):9.0f}  {results[-1][2]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
