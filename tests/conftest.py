"""Shared test fixtures: where the shared reference data lives (beside the checkout)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"shared data folder not found at {SHARED}")
    return SHARED


@pytest.fixture(scope="session")
def dev_runs_path(shared_dir: Path) -> Path:
    path = shared_dir / "reference" / "runs-dev.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    return path


@pytest.fixture
def runs_subset(tmp_path: Path, dev_runs_path: Path) -> Callable[[Iterable[str]], Path]:
    """Writes the dev runs of the given sources (``S02``, ...) to a JSONL file in ``tmp_path``; returns its path."""

    def write(sources: Iterable[str]) -> Path:
        wanted = set(sources)
        lines = [ln for ln in dev_runs_path.read_text(encoding="utf-8").splitlines()
                 if ln.strip() and json.loads(ln)["id"].split("-")[0] in wanted]
        path = tmp_path / "runs.jsonl"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path

    return write


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    """Skips are loud: every test here runs in CI (real Ray, Prometheus and HTTPS are started by the tests), so a
    skip means something the suite needs was missing (the shared data beside the checkout, the prometheus binary
    that .ci/run installs). Each reason is listed with its count at the end of the run."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    reasons: Counter[str] = Counter()
    for report in skipped:
        longrepr = getattr(report, "longrepr", None)
        reasons[str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)] += 1
    terminalreporter.write_sep("!", f"{len(skipped)} tests SKIPPED: what they need is missing here", red=True)
    for reason, count in reasons.most_common():
        terminalreporter.write_line(f"  {count:4d} x {reason}")
