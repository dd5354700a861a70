"""promtool checks the alerting rules and runs their unit tests (skipped where promtool is absent)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

RULES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
PROMTOOL = shutil.which("promtool")

pytestmark = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package `prometheus`; .ci/run installs it)"
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=RULES_DIR, capture_output=True, text=True, timeout=60)


def test_promtool_check_rules() -> None:
    result = promtool("check", "rules", "vramfit-rules.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 4 rules found" in result.stdout


def test_promtool_rule_unit_tests() -> None:
    result = promtool("test", "rules", "vramfit-rules.test.yaml")
    assert result.returncode == 0, result.stdout + result.stderr


def unit_tests_with(tmp_path: Path, old: str, new: str) -> subprocess.CompletedProcess[str]:
    """The rule unit tests run against the rule file with ``old`` replaced by ``new``."""
    rules = (RULES_DIR / "vramfit-rules.yaml").read_text()
    assert old in rules
    (tmp_path / "vramfit-rules.yaml").write_text(rules.replace(old, new))
    shutil.copy(RULES_DIR / "vramfit-rules.test.yaml", tmp_path)
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, "test", "rules", "vramfit-rules.test.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )


def test_promtool_unit_tests_fail_on_a_wrong_threshold(tmp_path: Path) -> None:
    """The unit tests can fail: with the under-prediction threshold raised to 50% they must."""
    result = unit_tests_with(tmp_path, ") > 0.1\n", ") > 0.5\n")
    assert result.returncode != 0
    assert "VramfitUnderPredictionRateHigh" in result.stdout + result.stderr


def test_an_oom_series_prometheus_only_starts_to_see_does_not_alert(tmp_path: Path) -> None:
    """Without the start-time condition, a collector's lifetime OOM count alerts as OOMs of the last 30 minutes
    as soon as a Prometheus starts scraping it (pool h100 of the unit tests)."""
    result = unit_tests_with(tmp_path, "and\n            (time() - vramfit_ooms_start_time_seconds < 1800)",
                             "and\n            vramfit_ooms_total")
    assert result.returncode != 0
    assert 'pool="h100"' in result.stdout + result.stderr


def test_the_oom_alert_counts_whole_jobs(tmp_path: Path) -> None:
    """increase() extrapolates one OOM to 1.009 when scrapes do not line up with the window; the alert says 1."""
    result = unit_tests_with(tmp_path, '{{ printf "%.0f" $value }} {{ $labels.method }}',
                             "{{ $value | humanize }} {{ $labels.method }}")
    assert result.returncode != 0
    assert "1.009 full job(s)" in result.stdout + result.stderr
