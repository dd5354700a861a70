"""The alert rules and the Grafana dashboard: valid PromQL, real metric names, and promtool unit tests."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from scheduler.integrations.metrics import Metrics
from tests.integrations.processes import PROMTOOL

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy/prometheus/vramfit-rules.yaml"
RULE_TESTS = ROOT / "deploy/prometheus/vramfit-rules.test.yaml"
DASHBOARD = ROOT / "deploy/grafana/vramfit-dashboard.json"
NO_PROMTOOL = "promtool is not installed (apt-get install prometheus; CI installs it)"


def exported_names() -> set[str]:
    """What `vramfit serve` exports: every metric, the webhook's residual-model ones and the ledger size."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",), "info": ("",)}
    metrics = Metrics()
    metrics.watch_residual_models()
    return {family.name + suffix for family in metrics.registry.collect() for suffix in suffixes[family.type]} | {
        "vramfit_ledger_records"}


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def rule_exprs() -> list[str]:
    return [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_every_metric_named_is_exported(source):
    exprs = rule_exprs() if source == "rules" else dashboard_exprs()
    used = {name for e in exprs for name in re.findall(r"\bvramfit_[a-z_]+", e)}
    assert used, "no vramfit metric referenced"
    assert used <= exported_names(), f"unknown metrics: {sorted(used - exported_names())}"


def test_dashboard_shape():
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for topic in ("measured / predicted peak vram", "under-prediction", "ooms", "placements", "cost",
                  "admission latency", "predicted vs measured"):
        assert topic in titles
    assert {v["name"] for v in dash["templating"]["list"]} == {"datasource", "pool", "source"}


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
def test_promtool_checks_and_unit_tests_the_rules():
    check = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run([PROMTOOL, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, timeout=120,
                          cwd=RULE_TESTS.parent)
    assert unit.returncode == 0, unit.stdout + unit.stderr
    assert "SUCCESS" in unit.stdout


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
def test_dashboard_queries_are_valid_promql(tmp_path):
    """promtool parses each panel query as a recording rule (Grafana variables replaced by values)."""
    values = {"$__rate_interval": "5m", "$pool": ".*", "$source": ".*"}
    rules = []
    for i, expr in enumerate(dashboard_exprs()):
        for var, val in values.items():
            expr = expr.replace(var, val)
        rules.append({"record": f"dashboard:panel_{i}", "expr": expr})
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    check = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
