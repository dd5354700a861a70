"""The predictions-vs-actuals metrics against what the dashboard and the alert rules read from them: a job's OOM
counts once however many sources report it, no exported value becomes infinite, and every dashboard expression
parses and names only metrics the exporter exports."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scheduler.integrations.ledger import SqliteLedger
from scheduler.integrations.metrics import MAX_OOM_JOBS_REMEMBERED, Metrics
from scheduler.integrations.records import STORED, ActualIn, DecisionIn
from scheduler.integrations.server import store_actual, store_decision

GIB = 2**30
ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "vramfit-dashboard.json"
PROMTOOL = shutil.which("promtool")
# Metrics that carry a `source` label: the dashboard's "Actual source" selector must apply to each of them.
SOURCE_LABELLED = ("vramfit_vram_prediction_ratio", "vramfit_actual_peak_vram_bytes",
                   "vramfit_vram_under_predictions", "vramfit_runtime_prediction_ratio")


@pytest.fixture
def ledger(tmp_path: Path) -> SqliteLedger:
    return SqliteLedger(tmp_path / "ledger.sqlite")


def decision(decision_id: str, **fields: Any) -> DecisionIn:
    base: dict[str, Any] = {"decision_id": decision_id, "pool": "a100", "method": "lora",
                            "peak_vram_bytes": 10 * GIB, "peak_vram_upper_bytes": 11 * GIB, "runtime_seconds": 3600.0}
    return DecisionIn.model_validate(base | fields, context=STORED)  # as read back: rows from before the bounds


def actual(decision_id: str, source: str, **fields: Any) -> ActualIn:
    base: dict[str, Any] = {"decision_id": decision_id, "peak_vram_bytes": None, "runtime_seconds": 1800.0,
                            "oom": False, "source": source}
    return ActualIn.model_validate(base | fields, context=STORED)


def value(metrics: Metrics, name: str, **labels: str) -> float:
    found = metrics.registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def exported_samples(metrics: Metrics) -> list[tuple[str, dict[str, str], float]]:
    text = generate_latest(metrics.registry).decode()
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


# --- OOMs: one per job ----------------------------------------------------------------------------------

@pytest.mark.parametrize("decision_first", [True, False], ids=["decision-first", "actuals-first"])
def test_an_oom_reported_by_the_reporter_and_kubernetes_counts_once(ledger: SqliteLedger, decision_first: bool) -> None:
    metrics = Metrics()
    reports = [actual("j1", "reporter", peak_vram_bytes=12 * GIB, oom=True, exit_reason="CudaOOM"),
               actual("j1", "kubernetes", oom=True, exit_reason="CudaOOM")]
    if decision_first:
        store_decision(ledger, metrics, decision("j1"))
    for report in reports:
        store_actual(ledger, metrics, report)
    if not decision_first:
        store_decision(ledger, metrics, decision("j1"))
    assert value(metrics, "vramfit_ooms_total", pool="a100", method="lora") == 1
    # the per-source figures still count per source
    assert value(metrics, "vramfit_actuals_received_total", source="kubernetes") == 1
    assert value(metrics, "vramfit_vram_under_predictions_total", pool="a100", method="lora", source="reporter",
                 bound="upper") == 1


def test_ooms_of_different_jobs_each_count(ledger: SqliteLedger) -> None:
    metrics = Metrics()
    for job in ("j1", "j2"):
        store_decision(ledger, metrics, decision(job))
        store_actual(ledger, metrics, actual(job, "kubernetes", oom=True, exit_reason="CudaOOM"))
        store_actual(ledger, metrics, actual(job, "reporter", oom=True, exit_reason="CudaOOM"))
    assert value(metrics, "vramfit_ooms_total", pool="a100", method="lora") == 2


def test_the_oom_memory_is_bounded(ledger: SqliteLedger) -> None:
    metrics = Metrics()
    store_decision(ledger, metrics, decision("first"))
    store_actual(ledger, metrics, actual("first", "reporter", oom=True))
    for i in range(MAX_OOM_JOBS_REMEMBERED):
        assert metrics._first_oom_of(f"other-{i}")
    assert len(metrics._oom_jobs) == MAX_OOM_JOBS_REMEMBERED
    assert metrics._first_oom_of("first")  # forgotten: the oldest went first


def test_an_oom_counter_exports_when_it_started(ledger: SqliteLedger) -> None:
    """VramfitOomAfterPlacement tells a restarted collector (counter started at its first OOM) from a newly
    scraped one (counter started long ago) by ``vramfit_ooms_start_time_seconds``: at placement, and at the first
    OOM of a pool/method this process never placed a job in (it was placed before a restart)."""
    metrics = Metrics()
    store_decision(ledger, metrics, decision("placed-here"))
    before_restart = Metrics()
    store_decision(ledger, before_restart, decision("placed-earlier", pool="h100"))
    store_actual(ledger, metrics, actual("placed-earlier", "reporter", oom=True))
    started = {(labels["pool"], labels["method"]): v for name, labels, v in exported_samples(metrics)
               if name == "vramfit_ooms_start_time_seconds"}
    assert set(started) == {("a100", "lora"), ("h100", "lora")}
    assert all(v > 1.7e9 for v in started.values())  # Unix times
    assert value(metrics, "vramfit_ooms_total", pool="h100", method="lora") == 1


# --- finite values only -----------------------------------------------------------------------------------

def test_a_runtime_ratio_that_overflows_is_not_observed(ledger: SqliteLedger) -> None:
    metrics = Metrics()
    store_decision(ledger, metrics, decision("tiny", runtime_seconds=1e-300))
    store_actual(ledger, metrics, actual("tiny", "reporter", runtime_seconds=1e10, exit_reason="Completed"))
    store_decision(ledger, metrics, decision("fine"))
    store_actual(ledger, metrics, actual("fine", "reporter", runtime_seconds=1800.0, exit_reason="Completed"))
    labels = {"pool": "a100", "method": "lora", "source": "reporter"}
    assert value(metrics, "vramfit_runtime_prediction_ratio_count", **labels) == 1
    assert value(metrics, "vramfit_runtime_prediction_ratio_sum", **labels) == pytest.approx(0.5)


def test_absurd_predicted_costs_do_not_make_the_cost_counter_infinite(ledger: SqliteLedger) -> None:
    metrics = Metrics()
    store_decision(ledger, metrics, decision("a", predicted_cost_usd=1e308))
    store_decision(ledger, metrics, decision("b", predicted_cost_usd=1e308))
    store_decision(ledger, metrics, decision("c", predicted_cost_usd=12.5))
    assert value(metrics, "vramfit_predicted_cost_usd_total", pool="a100") == pytest.approx(12.5)


def test_every_exported_value_is_finite(ledger: SqliteLedger) -> None:
    metrics = Metrics()
    store_decision(ledger, metrics, decision("a", predicted_cost_usd=1e308, runtime_seconds=5e-324))
    store_decision(ledger, metrics, decision("b", predicted_cost_usd=1e308, peak_vram_bytes=1))
    store_actual(ledger, metrics, actual("a", "reporter", runtime_seconds=1e308, peak_vram_bytes=2**62))
    store_actual(ledger, metrics, actual("b", "dcgm", peak_vram_bytes=2**62, runtime_seconds=None))
    bad = [(name, labels, v) for name, labels, v in exported_samples(metrics) if not math.isfinite(v)]
    assert bad == []


# --- the dashboard against the exporter -----------------------------------------------------------------------

def dashboard_expressions() -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and query variable of the dashboard."""
    board = json.loads(DASHBOARD.read_text())
    out = [(f"panel {p['id']} ({p['title']}) {t['refId']}", t["expr"])
           for p in board["panels"] for t in p.get("targets", [])]
    out += [(f"variable {v['name']}", v["definition"]) for v in board["templating"]["list"] if "definition" in v]
    return out


def exported_names(tmp_path: Path) -> set[str]:
    metrics = Metrics()
    metrics.watch_ledger(SqliteLedger(tmp_path / "names.sqlite"))
    metrics.watch_residual_models()
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
                "gauge": ("",), "info": ("_info",)}
    return {family.name + suffix for family in metrics.registry.collect() for suffix in suffixes[family.type]}


def test_every_dashboard_expression_names_exported_metrics(tmp_path: Path) -> None:
    names = exported_names(tmp_path)
    unknown = [(where, name) for where, expr in dashboard_expressions()
               for name in re.findall(r"\bvramfit_[a-z0-9_]+", expr) if name not in names]
    assert unknown == []


def test_the_dashboard_shows_every_exported_metric(tmp_path: Path) -> None:
    """Each family the exporter exports is read by some panel (decisions the webhook could not forward to the
    collector were not: those jobs silently drop out of every accuracy panel)."""
    metrics = Metrics()
    metrics.watch_ledger(SqliteLedger(tmp_path / "families.sqlite"))
    metrics.watch_residual_models()
    shown = " ".join(expr for where, expr in dashboard_expressions() if where.startswith("panel"))
    for_alerts = {"vramfit_ooms_start_time_seconds"}
    assert [f.name for f in metrics.registry.collect() if f.name not in for_alerts and f.name not in shown] == []


def test_the_source_selector_applies_to_every_source_labelled_metric() -> None:
    """A panel that reads a per-source metric without ``source=~"$source"`` mixes the sources (each job once per
    source: the reporter's and Kubernetes' runtimes measure different spans) whatever the selector says."""
    missing = [(where, name) for where, expr in dashboard_expressions() if where.startswith("panel")
               for name, selector in re.findall(r"\b(vramfit_[a-z_]+)(\{[^}]*\})?", expr)
               if re.sub(r"_(total|bucket|sum|count)$", "", name) in SOURCE_LABELLED
               if 'source=~"$source"' not in selector]
    assert missing == []


def test_every_panel_queries_the_datasource_variable() -> None:
    board = json.loads(DASHBOARD.read_text())
    wrong = [p["id"] for p in board["panels"] if p["type"] != "row"
             for d in [p.get("datasource"), *(t.get("datasource") for t in p.get("targets", []))]
             if d != {"type": "prometheus", "uid": "${datasource}"}]
    assert wrong == []


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package `prometheus`)")
def test_every_dashboard_expression_parses(tmp_path: Path) -> None:
    """Each expression, with Grafana's variables filled in, as a recording rule that promtool checks."""
    fill = {"$pool": ".*", "$source": ".*", "$__rate_interval": "1m"}
    rules = []
    panels = [expr for where, expr in dashboard_expressions() if where.startswith("panel")]  # not label_values()
    for i, expr in enumerate(panels):
        for variable, text in fill.items():
            expr = expr.replace(variable, text)
        rules.append({"record": f"vramfit:dashboard_{i}", "expr": expr})
    (tmp_path / "dashboard.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    assert PROMTOOL is not None
    result = subprocess.run([PROMTOOL, "check", "rules", "dashboard.yaml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout
