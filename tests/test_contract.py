"""The TrainingSpec v1 contract (shared/TRAINING_SPEC.md) and its ``vramfit predict --format json`` output, kept
by every example, job manifest and shared fixture: field names, types and units, breakdowns that add up to the
levels they explain, and specs that survive parse -> dict -> parse."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from predictors.catalog import resolve_model
from predictors.persistence import load_default_model
from predictors.predict import (
    CONTRACT_COMPONENTS,
    LEVELS,
    Prediction,
    component_level,
    level_corrections,
    predict,
    resolve_gpu,
)
from predictors.residual_serving import correct_vram_many, margin_group
from predictors.spec import parse_training_spec, spec_to_dict
from predictors.vram import on_gpu, predict_vram_without_gpu
from scheduler.cli import main
from scheduler.spec.document import ParsedJob, load_documents, read_text, scan_documents

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO.parent / "shared" / "fixtures"
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
JOBS = sorted(p for p in (REPO / "examples" / "jobs").iterdir() if p.suffix in (".yaml", ".json"))
# name -> type of every scalar the output contract names (sizes in bytes are ints)
CONTRACT_INTS = ("peak_allocated_bytes", "peak_reserved_bytes", "peak_vram_bytes", "peak_vram_upper_bytes",
                 "params_total", "params_trainable")
CONTRACT_FLOATS = ("throughput_tokens_per_second", "runtime_seconds")


def _predict_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    assert main(["predict", *args, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def assert_explained(out: dict[str, Any]) -> None:
    """``out`` keeps the output contract, and its breakdown explains each of the three levels."""
    for name in CONTRACT_INTS:
        assert type(out[name]) is int, name
    for name in CONTRACT_FLOATS:
        if name in out:
            assert type(out[name]) is float and out[name] > 0, name
    breakdown = out["breakdown_bytes"]
    assert set(CONTRACT_COMPONENTS) <= set(breakdown)  # every component the contract names, 0 when not live
    assert all(type(v) is int for v in breakdown.values())
    assert sum(breakdown.values()) == out["peak_vram_bytes"]
    assert out["peak_allocated_bytes"] <= out["peak_reserved_bytes"] <= out["peak_vram_bytes"]
    assert out["peak_vram_upper_bytes"] >= out["peak_vram_bytes"]
    assert out["params_trainable"] <= out["params_total"]
    levels, corrections = out["component_levels"], out["residual_correction_bytes"]
    assert set(levels) == set(breakdown) and set(corrections) == set(LEVELS)
    for i, level in enumerate(LEVELS):
        counted = sum(v for k, v in breakdown.items()
                      if k != "residual_correction" and LEVELS.index(levels[k]) <= i)
        assert counted + corrections[level] == out[level], level
    assert corrections["peak_vram_bytes"] == breakdown.get("residual_correction", 0)


@pytest.mark.parametrize("path", EXAMPLES + JOBS, ids=lambda p: p.name)
def test_predict_json_keeps_the_output_contract(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _predict_json(capsys, str(path))
    assert isinstance(out, dict)  # one document: one object
    assert_explained(out)
    assert ("throughput_tokens_per_second" in out) == ("gpu" in out)  # a throughput needs a GPU
    assert ("runtime_step_seconds" in out) == ("gpu" in out)  # and so does its explanation
    if out["model_version"] != "analytic":  # the shipped residual keeps the analytic levels
        assert out["residual_correction_bytes"] == dict.fromkeys(LEVELS, 0)


@pytest.mark.parametrize("path", [REPO / "examples" / "llama-3.1-8b-full.yaml",
                                  REPO / "examples" / "llama-2-7b-lora.yaml",
                                  REPO / "examples" / "jobs" / "trl-qlora-pytorchjob.yaml"], ids=lambda p: p.name)
def test_predict_json_on_a_gpu_has_throughput_and_runtime(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _predict_json(capsys, str(path), "--gpu", "H100-80GB", "--gpus", "8")
    assert_explained(out)
    assert out["gpu"] == "H100-80GB" and out["gpus"] == 8
    spec = parse_training_spec(yaml.safe_load(path.read_text())) if path.parent.name == "examples" else None
    if spec is not None and spec.train_tokens is not None:  # runtime = the job's tokens / the job's throughput
        assert out["runtime_seconds"] == pytest.approx(spec.train_tokens / out["throughput_tokens_per_second"])
    # the runtime explained: the step's parts add up to its time, which with the tokens of a step and the runtime
    # residual's correction gives the throughput
    assert sum(out["runtime_step_seconds"].values()) == pytest.approx(out["step_time_seconds"])
    assert out["throughput_tokens_per_second"] == pytest.approx(
        out["tokens_per_step"] / out["step_time_seconds"] * out.get("runtime_correction_ratio", 1.0))
    assert "compute" in out["runtime_step_seconds"] or "memory_floor" in out["runtime_step_seconds"]


def test_predict_json_names_each_document_of_a_multi_document_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    text = "\n---\n".join((REPO / "examples" / n).read_text() for n in ("llama-2-7b-lora.yaml",
                                                                        "bert-large-classification.yaml"))
    path = tmp_path / "two.yaml"
    path.write_text(text)
    outs = _predict_json(capsys, str(path))
    assert isinstance(outs, list) and len(outs) == 2
    for out in outs:
        assert_explained(out)
    # each names its document as the error messages do (`two.yaml [1]`); both read "TrainingSpec" before
    assert [o["job"] for o in outs] == ["TrainingSpec [0]", "TrainingSpec [1]"]
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    assert _predict_json(capsys, "-") == outs


def test_predict_json_from_stdin_is_the_files(capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = REPO / "examples" / "jobs" / "ray-submission.json"
    from_file = _predict_json(capsys, str(path))
    monkeypatch.setattr("sys.stdin", io.StringIO(path.read_text()))
    assert _predict_json(capsys, "-") == from_file


def test_levels_are_explained_when_the_residual_moves_them() -> None:
    """A residual with a site offset (``vramfit train`` on this cluster's actuals) corrects allocated and
    reserved too: the breakdown's analytic components then add up to neither, and ``residual_correction_bytes``
    says by how much each level moved."""
    loaded = load_default_model()
    if loaded is None:
        pytest.skip("no shipped residual model")
    spec = parse_training_spec({"model": "llama-2-7b", "method": "lora", "gpu": "A100-80GB"})
    resolved = resolve_model(spec)
    model = copy.copy(loaded.model)
    model.site_offsets_ = {margin_group(spec): -0.2}  # this site measures 18 % below the model
    gpu = resolve_gpu(spec)
    analytic = on_gpu(predict_vram_without_gpu(spec, resolved.architecture, None), gpu)
    fixed = correct_vram_many(model, spec, resolved.architecture, [(gpu, analytic)])[0]
    pred = Prediction(spec=spec, model=resolved, gpu=gpu, vram=fixed.vram, peak_vram_upper_bytes=fixed.upper_bytes)
    out = {**pred.to_dict(), **pred.level_explanation()}
    assert_explained(out)
    corrections = level_corrections(fixed.vram)
    assert corrections["peak_allocated_bytes"] == fixed.vram.peak_allocated_bytes - analytic.peak_allocated_bytes
    assert corrections["peak_allocated_bytes"] < 0


def test_component_levels_match_the_analytic_model_on_every_dev_run(dev_runs_path: Path) -> None:
    """Without a residual, each level is exactly its components (rounding aside): a component that vram.py adds
    outside the allocator must be listed in predictors.predict, or this fails."""
    from predictors.reference import parse_runs

    runs = parse_runs(dev_runs_path.read_text(encoding="utf-8"))
    for run in runs:
        pred = predict(run.spec, gpu_name=None if run.gpu == "unknown" else run.gpu, residual=False)
        corrections = level_corrections(pred.vram)
        slack = len(pred.vram.breakdown_bytes)  # each component is rounded to whole bytes on its own
        assert all(abs(v) <= slack for v in corrections.values()), (run.id, corrections)
    assert component_level("nccl_buffers") == "peak_vram_bytes"
    assert component_level("allocator_overhead") == "peak_reserved_bytes"


# ---- TrainingSpec serialisation ---------------------------------------------------------------------------------

def _jobs(path: Path, annotate: bool = False) -> list[ParsedJob]:
    docs = load_documents(read_text(path), str(path))
    if annotate:  # a fixture that names no model trains once its owner says which (the webhook's annotation)
        for doc in docs:
            if isinstance(doc, dict) and isinstance(doc.get("metadata"), dict):
                doc["metadata"].setdefault("annotations", {})["vramfit.io/spec"] = "model: llama-3.1-8b"
    return [o for o in scan_documents(docs, str(path), path.parent, []) if isinstance(o, ParsedJob)]


def _assert_round_trips(job: ParsedJob) -> None:
    data = spec_to_dict(job.spec)
    for text in (json.dumps(data), yaml.safe_dump(data)):  # JSON, and YAML as `vramfit parse` prints it
        again = parse_training_spec(yaml.safe_load(text))
        assert again == job.spec and spec_to_dict(again) == data, job.ref


@pytest.mark.parametrize("path", EXAMPLES + JOBS, ids=lambda p: p.name)
def test_examples_round_trip(path: Path) -> None:
    jobs = _jobs(path)
    assert jobs
    for job in jobs:
        _assert_round_trips(job)


def test_fixtures_that_train_round_trip(shared_dir: Path) -> None:
    trained = 0
    for path in sorted(FIXTURES.glob("*.y*ml")) + sorted(FIXTURES.glob("*.json")):
        for job in _jobs(path, annotate=True):
            _assert_round_trips(job)
            trained += 1
    assert trained >= 5


def test_parse_cli_output_parses_back_to_the_same_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "s.yaml"
    source.write_text("model: llama-2-7b\nmethod: lora\nlora: {rank: 8, dropout: 0.00001}\ntrain_tokens: 1.5e14\n"
                      "deadline_seconds: 0.00001\n")
    assert main(["parse", str(source), "--format", "json"]) == 0
    first = json.loads(capsys.readouterr().out)["spec"]
    again = tmp_path / "again.json"
    again.write_text(json.dumps(first))
    assert main(["parse", str(again), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["spec"] == first


def test_defaults_are_the_contracts() -> None:
    spec = parse_training_spec({"model": "llama-2-7b"})
    assert spec_to_dict(spec) == {
        "model": "llama-2-7b", "task": "causal-lm", "method": "full", "precision": "bf16-mixed",
        "optimizer": "adamw", "micro_batch_size": 1, "seq_len": 2048, "gradient_checkpointing": "none",
        "attention": "sdpa", "gpus": 1, "offload": "none", "tensor_parallel": 1, "pipeline_parallel": 1,
        "context_parallel": 1, "grad_accum_steps": 1}
    assert spec.resolved_sharding() == "none" and spec.resolved_sharding(4) == "ddp"
    qlora = parse_training_spec({"model": "llama-2-7b", "method": "qlora"})
    assert qlora.resolved_quantization == "nf4-dq" and qlora.resolved_lora is not None
