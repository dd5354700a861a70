"""What the container image (deploy/Dockerfile) installs, checked without Docker.

Builds a wheel of this tree, installs ``vramfit[server,kube]`` from it into a fresh virtual environment (as the
Dockerfile does), and runs there what the manifests run: a prediction with the shipped residual models (no
"analytic only" warning: the package data made it into the wheel), the webhook's and the collector's command
lines, and the imports their servers and the Pod watch need. Prints one line per check and the wheel's size;
exits 1 when a check fails.

    python bench/image_contents.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPEC = "model: llama-3.1-8b\nmethod: lora\ngpus: 1\ntrain_tokens: 10M\n"


def run(argv: list[str], stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, cwd=cwd, timeout=900, check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", type=Path, help="build in this folder and keep it (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        wheel_dir = work / "wheels"
        built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheel_dir), str(REPO)])
        if built.returncode:
            print(built.stdout + built.stderr)
            return 1
        (wheel,) = wheel_dir.glob("vramfit-*.whl")
        venv = work / "venv"
        run([sys.executable, "-m", "venv", str(venv)])
        python, vramfit = venv / "bin" / "python", venv / "bin" / "vramfit"
        installed = run([str(python), "-m", "pip", "install", "-q", f"vramfit[server,kube] @ {wheel.as_uri()}"])
        if installed.returncode:
            print(installed.stdout + installed.stderr)
            return 1
        print(f"wheel {wheel.name}: {wheel.stat().st_size / 2**20:.1f} MiB; built and installed in "
              f"{time.perf_counter() - started:.0f} s")
        outside = work  # run from outside the source tree: only the installed package is importable
        checks = [
            ("predict (shipped residual models)", [str(vramfit), "predict", "-", "--gpu", "L40S"], SPEC,
             lambda p: p.returncode == 0 and "upper bound (placement)" in p.stdout and "warning" not in p.stderr),
            ("place (embedded pools)", [str(vramfit), "place", "-"], SPEC,
             lambda p: p.returncode == 0 and p.stdout.startswith("placed on")),
            ("serve --help (webhook)", [str(vramfit), "serve", "--help"], None, lambda p: p.returncode == 0),
            ("collect --help (collector)", [str(vramfit), "collect", "--help"], None, lambda p: p.returncode == 0),
            ("server and Pod-watch imports", [str(python), "-c", "import uvicorn, starlette, prometheus_client, "
                                              "httpx, kubernetes; from scheduler.integrations import webhook, "
                                              "kube_watch, server"], None, lambda p: p.returncode == 0),
        ]
        failed = 0
        for label, argv, stdin, ok in checks:
            proc = run(argv, stdin, cwd=outside)
            good = ok(proc)
            failed += not good
            print(f"{'ok  ' if good else 'FAIL'} {label}")
            if not good:
                print((proc.stdout + proc.stderr)[-2000:])
        return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
