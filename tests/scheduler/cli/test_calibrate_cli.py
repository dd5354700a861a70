"""``vramfit calibrate``: its flags, and a SIGTERM or SIGINT to the parent that takes the running worker down with
it (a worker runs in a session of its own, so nothing else would: it was left orphaned, holding the GPU)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from scheduler.cli import main

REPO = Path(__file__).resolve().parents[3]
SMOKE_SWEEP = REPO / "bench" / "sweeps" / "cpu-smoke.yaml"


def test_retry_failed_goes_with_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rows.jsonl"
    out.write_text('{"calibration": {"config_id": "x", "outcome": "crash"}}\n', encoding="utf-8")
    assert main(["calibrate", "--sweep", str(SMOKE_SWEEP), "--out", str(out), "--retry-failed"]) == 2
    assert "`--retry-failed` goes with --resume" in capsys.readouterr().err
    assert "crash" in out.read_text(encoding="utf-8")  # nothing dropped


def _live_processes_with(marker: str) -> list[int]:
    """Processes (not zombies) whose environment holds ``marker``: the CLI and the workers it started."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if marker.encode() not in (proc / "environ").read_bytes():
                continue
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # it ended meanwhile, or it is not ours to read
            continue
        if state != "Z":
            pids.append(int(proc.name))
    return pids


def _default_sigint() -> None:
    """In the child: SIGINT as an interactive shell leaves it. A test run started in the background (`cmd &`)
    inherits SIGINT ignored, and Python then never raises KeyboardInterrupt for it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for(condition: Callable[[], object], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize(("signum", "exit_code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_to_the_parent_ends_its_worker(signum: int, exit_code: int, tmp_path: Path) -> None:
    for package in ("torch", "transformers", "peft"):  # what the sweep checks for before it starts a worker
        pytest.importorskip(package)
    marker = f"VRAMFIT_TEST_{uuid.uuid4().hex}"  # the workers inherit the parent's environment
    env = {**os.environ, "PYTHONPATH": str(REPO), marker: "1"}
    out = tmp_path / "rows.jsonl"
    parent = subprocess.Popen([sys.executable, "-m", "scheduler.cli", "calibrate", "--sweep", str(SMOKE_SWEEP),
                               "--out", str(out), "--device", "cpu"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
    try:
        _wait_for(lambda: set(_live_processes_with(marker)) - {parent.pid}, 60, "a calibration worker")
        parent.send_signal(signum)
        _, stderr = parent.communicate(timeout=30)
        assert parent.returncode == exit_code, stderr
        assert "Traceback" not in stderr
        _wait_for(lambda: not _live_processes_with(marker), 10, "the worker to end with its parent")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.communicate()


def test_only_runs_in_the_order_given(capsys: pytest.CaptureFixture[str]) -> None:
    """--only is a priority order: a sweep cut short by a device's time limit has measured what came first."""
    sweep = str(REPO / "bench" / "sweeps" / "default.yaml")
    assert main(["calibrate", "--sweep", sweep, "--list", "--only", "scaled-layers", "--only", "gpt2-full"]) == 0
    groups = [line.split()[1] for line in capsys.readouterr().out.strip().splitlines()]
    assert groups == ["scaled-layers"] * 7 + ["gpt2-full"] * 12
    assert main(["calibrate", "--sweep", sweep, "--list", "--only", "gpt2-full", "--only", "scaled-layers"]) == 0
    groups = [line.split()[1] for line in capsys.readouterr().out.strip().splitlines()]
    assert groups == ["gpt2-full"] * 12 + ["scaled-layers"] * 7
