"""The webhook re-loads this cluster's residual models when their files change (a model retrained with
``vramfit train --ledger`` copied over the old one), installs a checked model in one step, and keeps the model
in use when the new file is unusable."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from predictors import persistence
from predictors.predict import predict
from predictors.spec import TrainingSpec
from scheduler.integrations.server import create_app
from scheduler.integrations.webhook import ResidualModelsWatch, WebhookState, webhook_routes
from scheduler.placement import clear_prediction_cache
from tests.integrations.manifests import SPEC_1B_LORA, admission_review, pod

SPEC = TrainingSpec.model_validate({"model": "llama-3.2-1b", "method": "lora", "gpu": "A100-80GB"})


@pytest.fixture(scope="module")
def estimator() -> Any:
    return persistence.load_model(persistence.shipped_model_path(), serving=False).model


def _save(estimator: Any, path: Path, version: str) -> None:
    persistence.save_model(estimator, path, persistence.build_metadata(model_version=version))


@pytest.fixture
def cluster_model(tmp_path: Path, estimator: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    path = tmp_path / "cluster.skops"
    _save(estimator, path, "residual-cluster-a")
    monkeypatch.setenv(persistence.MODEL_ENV, str(path))
    persistence.load_default_model.cache_clear()
    clear_prediction_cache()
    yield path
    monkeypatch.delenv(persistence.MODEL_ENV)
    persistence.load_default_model.cache_clear()
    clear_prediction_cache()


def test_a_retrained_model_replaces_the_one_in_use(cluster_model: Path, estimator: Any,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    watch = ResidualModelsWatch()
    assert predict(SPEC).model_version == "residual-cluster-a"
    watch.check()
    assert watch.reloads == 0  # nothing changed
    _save(estimator, cluster_model, "residual-cluster-b")
    with caplog.at_level(logging.INFO, logger="vramfit.webhook"):
        watch.check()
    assert watch.reloads == 1 and predict(SPEC).model_version == "residual-cluster-b"
    assert any(r.getMessage() == "residual model reloaded" for r in caplog.records)
    # a broken file (a half-copied one, another scikit-learn's) is logged; the model in use stays
    cluster_model.write_bytes(b"not a model")
    persistence.serving_path(cluster_model).unlink()
    with caplog.at_level(logging.ERROR, logger="vramfit.webhook"):
        watch.check()
    assert watch.reloads == 1 and predict(SPEC).model_version == "residual-cluster-b"
    assert any("unusable" in r.getMessage() for r in caplog.records)
    _save(estimator, cluster_model, "residual-cluster-c")
    watch.check()
    assert watch.reloads == 2 and predict(SPEC).model_version == "residual-cluster-c"


def test_a_model_whose_serving_file_is_not_written_yet_waits(cluster_model: Path, estimator: Any,
                                                             tmp_path: Path) -> None:
    """save_model writes the model file, then its serving file: a check between the two leaves it for later
    instead of loading the model the slow way (scikit-learn) and again once the serving file lands."""
    serving = persistence.serving_path(cluster_model)
    stale = serving.read_bytes()
    watch = ResidualModelsWatch()
    assert predict(SPEC).model_version == "residual-cluster-a"
    _save(estimator, cluster_model, "residual-cluster-b")
    fresh = serving.read_bytes()
    serving.write_bytes(stale)  # the model file is new, its serving file still the old model's
    watch.check()
    assert watch.reloads == 0 and predict(SPEC).model_version == "residual-cluster-a"
    serving.write_bytes(fresh)
    watch.check()
    assert watch.reloads == 1 and predict(SPEC).model_version == "residual-cluster-b"
    # a model file replaced by something that is no model, beside the old serving file, is not waited on forever
    cluster_model.write_bytes(b"not a model")
    outcomes: list[str] = []
    watch = ResidualModelsWatch(on_reload=lambda kind, outcome: outcomes.append(outcome))
    watch._stamps[cluster_model] = ()  # as if it had just changed
    for _ in range(ResidualModelsWatch.SERVING_FILE_WAITS + 1):
        watch.check()
    assert outcomes == ["rejected"] and predict(SPEC).model_version == "residual-cluster-b"


def test_the_running_watch_reloads_and_the_webhook_reviews_with_the_new_model(cluster_model: Path,
                                                                               estimator: Any) -> None:
    records: list[dict[str, Any]] = []
    watch = ResidualModelsWatch(interval_seconds=0.05).start()
    state = WebhookState(on_decision=records.append, models=watch)
    review = admission_review(pod(1, SPEC_1B_LORA))
    try:
        with TestClient(create_app(None, extra_routes=webhook_routes(state))) as client:
            assert client.post("/mutate", json=review).status_code == 200
            _save(estimator, cluster_model, "residual-cluster-b")
            deadline = time.monotonic() + 10
            while watch.reloads == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert watch.reloads == 1
            assert client.post("/mutate", json=review).status_code == 200
    finally:
        watch.stop()
    assert len(records) == 2
    assert records[0]["model_version"].startswith("residual-cluster-a-")  # then the package version
    assert records[1]["model_version"].startswith("residual-cluster-b-")


def test_without_the_variables_nothing_is_watched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(persistence.MODEL_ENV, raising=False)
    monkeypatch.delenv(persistence.RUNTIME_MODEL_ENV, raising=False)
    watch = ResidualModelsWatch(interval_seconds=0.01).start()
    assert watch._thread is None  # no thread for nothing to watch
    watch.check()
    watch.stop()
    assert watch.reloads == 0


def test_metrics_show_the_model_in_use_and_count_reloads(cluster_model: Path, estimator: Any) -> None:
    """vramfit_residual_model_info names the model predictions use now; vramfit_residual_model_reloads_total
    counts the changed files by outcome (a rejected one is what an operator must look at)."""
    from prometheus_client import generate_latest

    from scheduler.integrations.metrics import Metrics

    metrics = Metrics(version="test")
    metrics.watch_residual_models()
    watch = ResidualModelsWatch(on_reload=metrics.on_model_reload)

    def exported() -> str:
        return generate_latest(metrics.registry).decode()

    predict(SPEC)  # the process has loaded its models
    assert 'vramfit_residual_model_info{kind="vram",model_version="residual-cluster-a"} 1.0' in exported()
    _save(estimator, cluster_model, "residual-cluster-b")
    watch.check()
    text = exported()  # a scrape right after the reload already names the new model
    assert 'vramfit_residual_model_info{kind="vram",model_version="residual-cluster-b"} 1.0' in text
    assert 'vramfit_residual_model_reloads_total{kind="vram",outcome="reloaded"} 1.0' in text
    persistence.serving_path(cluster_model).unlink()
    cluster_model.write_bytes(b"half a model")
    watch.check()
    text = exported()
    assert 'vramfit_residual_model_reloads_total{kind="vram",outcome="rejected"} 1.0' in text
    assert 'vramfit_residual_model_info{kind="vram",model_version="residual-cluster-b"} 1.0' in text
