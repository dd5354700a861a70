"""The webhook re-loads this cluster's residual models when their files change (a model retrained with
``vramfit train --ledger`` copied over the old one), and keeps the model in use when the new file is unusable."""

from __future__ import annotations

import logging
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
    clock = [0.0]
    watch = ResidualModelsWatch(interval_seconds=5.0, clock=lambda: clock[0])
    assert predict(SPEC).model_version == "residual-cluster-a"
    _save(estimator, cluster_model, "residual-cluster-b")
    watch()  # within the interval: the files are not looked at yet
    assert watch.reloads == 0 and predict(SPEC).model_version == "residual-cluster-a"
    clock[0] = 6.0
    with caplog.at_level(logging.INFO, logger="vramfit.webhook"):
        watch()
    assert watch.reloads == 1 and predict(SPEC).model_version == "residual-cluster-b"
    assert any(r.getMessage() == "residual model reloaded" for r in caplog.records)
    # a broken file (a half-copied one, another scikit-learn's) is logged; the model in use stays
    cluster_model.write_bytes(b"not a model")
    persistence.serving_path(cluster_model).unlink()
    clock[0] = 12.0
    with caplog.at_level(logging.ERROR, logger="vramfit.webhook"):
        watch()
    assert watch.reloads == 1 and predict(SPEC).model_version == "residual-cluster-b"
    assert any("unusable" in r.getMessage() for r in caplog.records)
    watch()  # the same broken file is not re-read at every call
    clock[0] = 18.0
    _save(estimator, cluster_model, "residual-cluster-c")
    watch()
    assert watch.reloads == 2 and predict(SPEC).model_version == "residual-cluster-c"


def test_the_webhook_reviews_with_the_new_model(cluster_model: Path, estimator: Any) -> None:
    records: list[dict[str, Any]] = []
    state = WebhookState(models=ResidualModelsWatch(interval_seconds=0.0), on_decision=records.append)
    review = admission_review(pod(1, SPEC_1B_LORA))
    with TestClient(create_app(None, extra_routes=webhook_routes(state))) as client:
        assert client.post("/mutate", json=review).status_code == 200
        _save(estimator, cluster_model, "residual-cluster-b")
        assert client.post("/mutate", json=review).status_code == 200
    assert len(records) == 2
    assert records[0]["model_version"].startswith("residual-cluster-a-")  # then the package version
    assert records[1]["model_version"].startswith("residual-cluster-b-")


def test_without_the_variables_nothing_is_watched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(persistence.MODEL_ENV, raising=False)
    monkeypatch.delenv(persistence.RUNTIME_MODEL_ENV, raising=False)
    watch = ResidualModelsWatch(interval_seconds=0.0)
    watch()
    assert watch.reloads == 0


def test_metrics_show_the_model_in_use_and_count_reloads(cluster_model: Path, estimator: Any) -> None:
    """vramfit_residual_model_info names the model predictions use now; vramfit_residual_model_reloads_total
    counts the changed files by outcome (a rejected one is what an operator must look at)."""
    from prometheus_client import generate_latest

    from scheduler.integrations.metrics import Metrics

    metrics = Metrics(version="test")
    metrics.watch_residual_models()
    clock = [0.0]
    watch = ResidualModelsWatch(interval_seconds=1.0, clock=lambda: clock[0], on_reload=metrics.on_model_reload)

    def exported() -> str:
        return generate_latest(metrics.registry).decode()

    predict(SPEC)  # the process has loaded its models
    assert 'vramfit_residual_model_info{kind="vram",model_version="residual-cluster-a"} 1.0' in exported()
    _save(estimator, cluster_model, "residual-cluster-b")
    clock[0] = 2.0
    watch()
    text = exported()  # a scrape right after the reload already names the new model
    assert 'vramfit_residual_model_info{kind="vram",model_version="residual-cluster-b"} 1.0' in text
    assert 'vramfit_residual_model_reloads_total{kind="vram",outcome="reloaded"} 1.0' in text
    cluster_model.write_bytes(b"half a model")
    clock[0] = 4.0
    watch()
    text = exported()
    assert 'vramfit_residual_model_reloads_total{kind="vram",outcome="rejected"} 1.0' in text
    assert 'vramfit_residual_model_info{kind="vram",model_version="residual-cluster-b"} 1.0' in text
