"""CLI: predict/evaluate output contracts and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduler.cli import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
CONTRACT_KEYS = {"peak_allocated_bytes", "peak_reserved_bytes", "peak_vram_bytes", "peak_vram_upper_bytes",
                 "breakdown_bytes", "params_total", "params_trainable"}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_predict_json_contract(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", str(example), "--format", "json", "--gpu", "H100-80GB"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= CONTRACT_KEYS
    assert all(isinstance(out[k], int) for k in CONTRACT_KEYS - {"breakdown_bytes"})
    assert sum(out["breakdown_bytes"].values()) == out["peak_vram_bytes"]
    assert out["peak_allocated_bytes"] <= out["peak_reserved_bytes"] <= out["peak_vram_bytes"]
    assert out["peak_vram_upper_bytes"] >= out["peak_vram_bytes"]
    assert out["gpu"] == "H100-80GB"


def test_predict_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", str(REPO / "examples" / "llama-3.1-8b-lora.yaml")]) == 0
    out = capsys.readouterr().out
    for word in ("weights", "activations", "logits", "peak device", "upper bound", "fits on:"):
        assert word in out
    assert "step:" not in out  # no GPU, no runtime


def test_predict_table_explains_the_step(capsys: pytest.CaptureFixture[str]) -> None:
    """With a GPU the table shows what one optimizer step is made of, and what runs under it."""
    assert main(["predict", str(REPO / "examples" / "bert-large-classification.yaml"), "--gpu", "H100-80GB"]) == 0
    out = capsys.readouterr().out
    step = next(line for line in out.splitlines() if line.startswith("  step: "))
    assert " tokens = " in step and "host_wait" in step  # a small BERT batch waits for the host
    assert "note (runtime): host bound" in out


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("model: llama-2-7bb\n", "unknown model 'llama-2-7bb'"),
        ("model: llama-2-7b\nmicro_batch_size: -3\n", "`spec.micro_batch_size` must be a positive integer"),
        ("model: [unclosed\n", "is not valid YAML"),
        ("model: llama-2-7b\ngpu: H1000\n", "unknown GPU 'H1000'"),
        ("", "is empty"),
        ("[" * 5000 + "]" * 5000, "is not valid YAML: nested too deeply"),
        ("model: llama-2-7b\nseq_len: 1e400\n", "`spec.seq_len` must be a finite number"),
        # a traceback before: Python will not convert more than 4,300 digits
        ("model: llama-2-7b\nseq_len: " + "9" * 5000 + "\n", "an integer of 5,000 characters is too long"),
    ],
)
def test_predict_bad_input_exits_2(tmp_path: Path, content: str, fragment: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(content)
    assert main(["predict", str(spec)]) == 2
    err = capsys.readouterr().err
    assert fragment in err
    assert "Traceback" not in err


def test_unknown_model_suggests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("model: llama-2-7bb\n")
    main(["predict", str(spec)])
    assert "did you mean llama-2-7b" in capsys.readouterr().err


def test_missing_file_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", "/nonexistent/spec.yaml"]) == 2
    assert "file not found" in capsys.readouterr().err


def test_evaluate_table_and_json(dev_runs_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", "--runs", str(dev_runs_path), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["overall"]["n"] >= 190 and set(out["by_source"]) >= {"S07", "S14"}
    assert main(["evaluate", "--runs", str(dev_runs_path)]) == 0
    assert "median" in capsys.readouterr().out


def test_evaluate_json_lists_every_run_with_rows(dev_runs_path: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs.jsonl"
    runs.write_text("\n".join(dev_runs_path.read_text(encoding="utf-8").splitlines()[:20]) + "\n")
    assert main(["evaluate", "--runs", str(runs), "--format", "json"]) == 0
    assert "rows" not in json.loads(capsys.readouterr().out)
    assert main(["evaluate", "--runs", str(runs), "--format", "json", "--rows"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["rows"]) == out["overall"]["n"] and len(out["runtime_rows"]) == out["runtime"]["runs"]
    row = out["rows"][0]
    assert row["error"] == pytest.approx(row["predicted_bytes"] / row["measured_bytes"] - 1)
    assert {"id", "source", "method", "metric", "level"} <= set(row)
    assert main(["evaluate", "--runs", str(runs), "--rows"]) == 0
    table = capsys.readouterr().out
    assert "rows (error = predicted/measured - 1):" in table
    assert "rows (error = predicted/measured tokens/s - 1):" in table


def test_evaluate_reports_bad_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs.jsonl"
    runs.write_text('{"id": "a"}\nnot json\n[1, 2]\n')
    assert main(["evaluate", "--runs", str(runs)]) == 2
    err = capsys.readouterr().err
    assert "line 1" in err and "line 2" in err and "not valid JSON" in err
    assert "`line 3` must be a JSON object (one reference run); got list" in err


def test_evaluate_reports_invalid_lines_and_evaluates_the_rest(dev_runs_path: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """One bad row of a large file does not throw the others away: they are evaluated and every bad line is
    named on stderr and in the JSON; --strict makes the bad lines an input error."""
    good = dev_runs_path.read_text(encoding="utf-8").splitlines()[:5]
    bad = json.loads(good[0])
    bad["spec"]["gpu"] = "MI250X"
    runs = tmp_path / "runs.jsonl"
    runs.write_text("\n".join([*good[:2], json.dumps(bad), "not json", *good[2:]]) + "\n")
    assert main(["evaluate", "--runs", str(runs), "--format", "json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["overall"]["n"] + len(out["oom"]["wrong"]) + out["oom"]["right"] + len(out["skipped"]) == 5
    assert len(out["invalid_lines"]) == 2
    assert "line 3: spec.gpu" in out["invalid_lines"][0] and "MI250X" in out["invalid_lines"][0]
    assert "line 4" in out["invalid_lines"][1] and "not valid JSON" in out["invalid_lines"][1]
    assert "2 problems in lines not evaluated" in captured.err and "MI250X" in captured.err
    assert main(["evaluate", "--runs", str(runs)]) == 0
    assert "Not evaluated: 2 problems in invalid lines" in capsys.readouterr().out
    assert main(["evaluate", "--runs", str(runs), "--strict"]) == 2
    err = capsys.readouterr().err
    assert "line 3: spec.gpu" in err and "line 4" in err and "Traceback" not in err


def test_evaluate_names_a_line_nested_too_deeply(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs.jsonl"
    runs.write_text("[" * 5000 + "]" * 5000 + "\n" + '{"id": ' + "9" * 5000 + "}\n")
    assert main(["evaluate", "--runs", str(runs)]) == 2
    err = capsys.readouterr().err
    assert "`line 1` is not valid JSON: nested too deeply" in err
    assert "`line 2` is not valid JSON: Exceeds the limit (4300 digits)" in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["predict", "place"])
def test_every_failing_document_is_named_and_nothing_is_printed_first(
        command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "multi.yaml"
    spec.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: b}\n---\n"
                    "model: llama-2-7b\nmethod: lora\n---\nmodel: nope1\n---\nmodel: llama-2-7b\ngpus: 3\n"
                    "tensor_parallel: 3\n")
    assert main([command, str(spec)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # the good first spec is not answered half-way
    # documents are counted from 0 in the file, the ConfigMap (which trains nothing) included
    assert "unknown model 'nope1' (in [2])" in captured.err
    assert "must divide the model's 32 attention heads; got 3 (in [3])" in captured.err
    # an unknown GPU is found when the file is read, before any prediction, naming its document too
    spec.write_text("model: llama-2-7b\n---\nmodel: llama-2-7b\ngpu: H1000\n")
    assert main([command, str(spec)]) == 2
    assert "`[1].gpu` unknown GPU 'H1000'" in capsys.readouterr().err


@pytest.mark.parametrize(("precision", "listed"), [("bf16-true", False), ("16-true", True)])
def test_fits_on_leaves_out_gpus_that_cannot_run_the_precision(tmp_path: Path, precision: str, listed: bool,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(f"model: llama-3.2-1b\nmethod: lora\nprecision: {precision}\n")
    assert main(["predict", str(spec)]) == 0
    fits = next(line for line in capsys.readouterr().out.splitlines() if "fits on:" in line)
    assert ("V100-32GB" in fits) is listed and "A100-80GB" in fits


def test_predict_on_a_gpu_without_bf16_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("model: llama-3.2-1b\nmethod: lora\nprecision: bf16-true\n")
    assert main(["predict", str(spec), "--gpu", "V100-32GB"]) == 0
    assert "V100-32GB has no bf16: bf16-true cannot run there" in capsys.readouterr().err
    assert main(["predict", str(spec), "--gpu", "A100-80GB"]) == 0
    assert "no bf16" not in capsys.readouterr().err


def test_evaluate_all_levels_compares_each_measured_level(capsys: pytest.CaptureFixture[str]) -> None:
    rows = str(REPO / "predictors" / "data" / "measured" / "H200.jsonl")
    assert main(["evaluate", "--runs", rows, "--format", "json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert set(one["by_metric"]) == {"allocated"}
    assert main(["evaluate", "--runs", rows, "--format", "json", "--all-levels"]) == 0
    every = json.loads(capsys.readouterr().out)
    assert set(every["by_metric"]) == {"allocated", "reserved", "nvml"}
    assert every["by_metric"]["nvml"]["n"] == every["by_metric"]["allocated"]["n"] == one["overall"]["n"]


def test_a_bad_gpu_flag_is_the_flags_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", str(REPO / "examples" / "llama-3.1-8b-lora.yaml"), "--gpu", "Z100"]) == 2
    err = capsys.readouterr().err
    assert "`--gpu` unknown GPU 'Z100'" in err
    assert "llama-3.1-8b-lora.yaml" not in err  # the spec file is fine


@pytest.mark.parametrize(("example", "gpu", "warning"), [
    ("llama-3.1-8b-full.yaml", "RTX-4090", "does not fit on RTX-4090: the expected peak"),
    # torchtune's 8B recipe for 24 GB cards: its paged 8-bit states go to host memory, the rest fits
    ("llama-3.1-8b-full-24gb.yaml", "RTX-4090", "fits on RTX-4090 only with the paged optimizer states"),
    ("llama-3.1-8b-lora.yaml", "A100", "GPU 'A100' read as A100-80GB; the catalog also has A100-40GB"),
    ("llama-3.1-8b-lora.yaml", "A100-80GB", None),
])
def test_predict_warns_when_the_named_gpu_is_too_small_or_ambiguous(
        example: str, gpu: str, warning: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", str(REPO / "examples" / example), "--gpu", gpu]) == 0
    err = capsys.readouterr().err
    if warning is None:
        assert "warning" not in err
    else:
        assert warning in err


def test_a_file_of_the_wrong_kind_gets_a_bounded_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "notes.md"
    runs.write_text("".join(f"line {i} of prose\n" for i in range(300)))
    assert main(["evaluate", "--runs", str(runs)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert "300 problems" in err[0] and len(err) == 52
    assert err[-1] == "  ... and 250 more (the first 50 are shown)"
