"""`vramfit place`: table and JSON output, pools files, errors with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from scheduler.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_place_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["place", str(EXAMPLES / "llama-2-7b-lora.yaml"), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["decision"] == "placed" and out["gpus"] == 1
    assert out["predicted_cost_usd"] > 0 and len(out["alternatives"]) == 4
    # the chosen pool's prediction, explained as `vramfit predict --format json` explains it
    pred = out["prediction"]
    assert pred["gpu"] == out["gpu"] and pred["peak_vram_upper_bytes"] == out["peak_vram_upper_bytes"]
    assert pred["runtime_seconds"] == out["predicted_runtime_seconds"]
    assert sum(pred["breakdown_bytes"].values()) == pred["peak_vram_bytes"]
    assert sum(pred["runtime_step_seconds"].values()) == pytest.approx(pred["step_time_seconds"])
    assert main(["place", str(EXAMPLES / "llama-3.1-70b-too-big.yaml"), "--format", "json"]) == 1
    assert "prediction" not in json.loads(capsys.readouterr().out)  # no pool chosen, no prediction of one


def test_place_table_unschedulable_is_an_answer_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    # 1, as `ray submit`: `vramfit place job.yaml && kubectl apply -f job.yaml` stops here
    assert main(["place", str(EXAMPLES / "llama-3.1-70b-too-big.yaml")]) == 1
    text = capsys.readouterr().out
    assert text.startswith("unschedulable") and "what would fit" in text


def test_a_deadline_flag_selects_the_deadline_objective(capsys: pytest.CaptureFixture[str]) -> None:
    main(["place", str(EXAMPLES / "llama-3.1-8b-lora.yaml"), "--deadline-hours", "1", "--format", "json"])
    assert json.loads(capsys.readouterr().out)["objective"] == "cheapest-within-deadline"
    assert main(["place", str(EXAMPLES / "llama-3.1-8b-lora.yaml"), "--deadline-hours", "1", "--objective",
                 "cheapest", "--format", "json"]) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert any("a deadline is set, but placement here uses the objective cheapest" in w for w in warnings)


def test_a_pin_no_pool_offers_gets_the_right_hint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "pinned.yaml"
    spec.write_text("model: llama-3.1-8b\nmethod: lora\ngpu: RTX-4090\ntrain_tokens: 100M\n")
    assert main(["place", str(spec)]) == 1
    assert "no pool offers the GPU the spec pins" in capsys.readouterr().out


def test_the_table_says_when_the_job_waits_for_capacity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text("pools:\n- {name: a, gpu: A100-80GB, gpus_per_node: 8, nodes: 1, price_usd_per_gpu_hour: 1.0, "
                     "free_gpus: 0}\n")
    assert main(["place", str(EXAMPLES / "llama-2-7b-lora.yaml"), "--pools", str(pools)]) == 0
    assert "waits for capacity: a has 0 free GPUs now, the job needs 1" in capsys.readouterr().out


def test_place_with_pools_file_and_objective(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text("pools:\n- {name: a, gpu: A100-80GB, gpus_per_node: 8, nodes: 1, price_usd_per_gpu_hour: 0.5}\n"
                     "- {name: h, gpu: H100, gpus_per_node: 8, nodes: 1, price_usd_per_gpu_hour: 9.0}\n")
    assert main(["place", str(EXAMPLES / "llama-2-7b-lora.yaml"), "--pools", str(pools),
                 "--objective", "fastest", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["pool"] == "h"


def test_pools_file_errors_have_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text("pools:\n- {name: a, gpu: A100-80GB, gpus_per_node: 8, nodes: 1, price_usd_per_gpu_hour: -1}\n")
    assert main(["place", str(EXAMPLES / "llama-2-7b-lora.yaml"), "--pools", str(pools)]) == 2
    assert "pools[0].price_usd_per_gpu_hour" in capsys.readouterr().err


def test_deadline_objective_needs_a_deadline(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(EXAMPLES / "llama-2-7b-lora.yaml")
    assert main(["place", path, "--objective", "cheapest-within-deadline"]) == 2
    assert "deadline" in capsys.readouterr().err
    assert main(["place", path, "--objective", "cheapest-within-deadline", "--deadline-hours", "100"]) == 0


@pytest.mark.parametrize("hours", ["-1", "0", "nan", "inf", "1e400"])
def test_a_deadline_that_is_not_a_positive_number_of_hours_is_an_input_error(
        hours: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(EXAMPLES / "llama-2-7b-lora.yaml")
    assert main(["place", path, "--objective", "cheapest-within-deadline", "--deadline-hours", hours]) == 2
    assert "`--deadline-hours` must be a positive number of hours" in capsys.readouterr().err


def test_place_rejects_a_deadline_that_is_not_a_positive_finite_number() -> None:
    from predictors.spec import parse_training_spec
    from scheduler.placement import place
    from scheduler.pools import default_pools

    spec = parse_training_spec({"model": "llama-2-7b", "method": "lora"})
    for bad in (-5.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="positive, finite"):
            place(spec, default_pools(), "cheapest-within-deadline", bad, suggest=False)


def test_a_spec_piped_on_standard_input(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import io

    text = (EXAMPLES / "llama-2-7b-lora.yaml").read_text(encoding="utf-8")
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    assert main(["place", "-", "--format", "json"]) == 0
    piped = json.loads(capsys.readouterr().out)
    assert main(["place", str(EXAMPLES / "llama-2-7b-lora.yaml"), "--format", "json"]) == 0
    assert piped == json.loads(capsys.readouterr().out)
    monkeypatch.setattr("sys.stdin", io.StringIO("model: [unclosed\n"))
    assert main(["place", "-"]) == 2
    assert "invalid input in <stdin>" in capsys.readouterr().err


def test_short_runtimes_are_shown_in_minutes_not_zero_hours(capsys: pytest.CaptureFixture[str]) -> None:
    """BERT-large fine-tuning takes minutes: the table said `0.0 h (upper 0.1 h)` for it."""
    assert main(["place", str(EXAMPLES / "bert-large-classification.yaml")]) == 0
    table = capsys.readouterr().out
    assert "0.0 h" not in table and " min" in table
    assert main(["predict", str(EXAMPLES / "bert-large-classification.yaml"), "--gpu", "L40S"]) == 0
    runtime = next(line for line in capsys.readouterr().out.splitlines() if "runtime:" in line)
    assert "min" in runtime and "0.0" not in runtime


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "-"), (0.01, "< 0.1 s"), (4.26, "4.3 s"), (42.4, "42 s"), (126, "2.1 min"), (900, "15 min"),
    (3600, "1.0 h"), (55_800, "15.5 h"), (5_000_000, "1,388.9 h"),
])
def test_one_duration_format(seconds: float | None, text: str) -> None:
    from scheduler.placement import format_duration

    assert format_duration(seconds) == text


@pytest.mark.parametrize("command", ["place", "predict"])
def test_a_trainjob_whose_runtime_is_installed_separately(tmp_path: Path, command: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The usual case: the ClusterTrainingRuntime lives in the cluster, not beside the TrainJob; --runtime gives it."""
    docs = [d for d in yaml.safe_load_all((EXAMPLES / "jobs" / "torchtune-trainjob.yaml").read_text()) if d]
    trainjob = tmp_path / "trainjob.yaml"
    runtime = tmp_path / "runtime.yaml"
    trainjob.write_text(yaml.safe_dump_all([d for d in docs if d["kind"] == "TrainJob"]))
    runtime.write_text(yaml.safe_dump_all([d for d in docs if d["kind"] != "TrainJob"]))
    assert main([command, str(trainjob)]) == 2
    assert "pass --runtime FILE" in capsys.readouterr().err
    assert main([command, str(trainjob), "--runtime", str(runtime)]) == 0
    assert ("llama-3.2-3b" if command == "predict" else "placed on l40s (4 x") in capsys.readouterr().out


def test_each_decision_of_a_multi_document_file_names_its_job(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    both = tmp_path / "two.yaml"
    both.write_text((EXAMPLES / "llama-2-7b-lora.yaml").read_text() + "\n---\n"
                    + (EXAMPLES / "llama-3.1-8b-lora.yaml").read_text())
    assert main(["place", str(both), "--format", "json"]) == 0
    assert [d["job"] for d in json.loads(capsys.readouterr().out)] == ["TrainingSpec [0]", "TrainingSpec [1]"]
    assert main(["place", str(both)]) == 0
    assert "# TrainingSpec [1]" in capsys.readouterr().out


def test_a_single_manifests_decision_names_its_job(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["place", str(EXAMPLES / "jobs" / "torchtune-trainjob.yaml"), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["job"].startswith("TrainJob ")


def test_without_train_tokens_the_table_says_runtime_and_cost_are_unknown(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "no-tokens.yaml"
    spec.write_text("model: llama-3.1-8b\nmethod: lora\n")
    assert main(["place", str(spec)]) == 0
    out = capsys.readouterr().out
    assert "per GPU, runtime and cost unknown (no train_tokens or steps)" in out.splitlines()[0]
    assert "-, -" not in out
    big = tmp_path / "big.yaml"
    big.write_text("model: llama-3.1-70b\nmethod: full\ngpus: 8\nsharding: zero3\n")
    assert main(["place", str(big)]) == 1
    out = capsys.readouterr().out
    assert "what would fit" in out and "-, -" not in out


def test_suggestions_say_what_the_allocator_cache_adds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Variable-length batches: on a named GPU the allocator's cache fills the device, so a suggestion's peak can be
    the card's whole memory; the line says how much of it is cache, and the JSON carries the figure."""
    spec = tmp_path / "unpacked.yaml"
    spec.write_text("model: qwen2.5-7b\nmethod: lora\nmicro_batch_size: 8\nseq_len: 2048\ngpu: A100-80GB\n"
                    "sequence_lengths: variable\nmean_seq_len: 1134\n")
    assert main(["place", str(spec)]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  - ")]
    assert lines and all("without the allocator's cache) -> " in line for line in lines), lines
    assert main(["place", str(spec), "--format", "json"]) == 1
    suggestions = json.loads(capsys.readouterr().out)["suggestions"]
    assert all(0 < s["allocator_cache_bytes"] < s["peak_vram_bytes"] for s in suggestions)
    # a fixed-length job has no cache: nothing added to its lines
    fixed = tmp_path / "fixed.yaml"
    fixed.write_text("model: llama-3.1-70b\nmethod: full\ngpus: 8\nsharding: zero3\n")
    main(["place", str(fixed)])
    assert "allocator's cache" not in capsys.readouterr().out
