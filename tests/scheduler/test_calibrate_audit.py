"""Audit of the calibration harness (2026-11): the spec a row claims is what ran (gradient accumulation,
``lora.modules_to_save``, a pinned GPU), OOM detection, and the output file's safety (a cut-off last line,
rows of another device, an --out that is not a writable file)."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from predictors.reference import parse_runs
from predictors.spec import parse_training_spec
from scheduler.calibrate import runner as runner_module
from scheduler.calibrate.runner import CalibrateError, RunnerOptions, WorkerOutcome, build_row, run_sweep
from scheduler.calibrate.sweep import SweepConfig, expand_sweep, parse_sweep
from scheduler.calibrate.worker import RESULT_PREFIX
from scheduler.cli import main as cli_main

TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256,
              "max_position_embeddings": 256, "tie_word_embeddings": False}
TINY_GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256, "n_inner": 256,
             "vocab_size": 256}
H100_ENV = {"device": "cuda", "gpu_name": "NVIDIA H100 80GB HBM3", "torch": "2.5.1+cu124",
            "transformers": "4.46.0", "peft": "0.13.0"}
A100_ENV = {**H100_ENV, "gpu_name": "NVIDIA A100-SXM4-80GB"}
CPU_ENV = {"device": "cpu", "gpu_name": None, "torch": "2.13.0+cpu", "transformers": "5.0", "peft": "0.21"}


def _configs(*explicit: dict[str, Any]) -> list[SweepConfig]:
    return expand_sweep(parse_sweep({"name": "audit", "configs": list(explicit)}))


def _tiny(**fields: Any) -> dict[str, Any]:
    return {"model": {"name": "tiny-llama", "config": TINY_LLAMA}, "seq_len": 16, "micro_batch_size": 2,
            "precision": "32-true", **fields}


def _run_in_process(spec: dict[str, Any], warmup_steps: int = 1, measured_steps: int = 2) -> dict[str, Any]:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from scheduler.calibrate.worker import run_job

    (config,) = _configs(spec)
    result = run_job({"mode": "run", "spec": config.spec_dict, "device": "cpu", "warmup_steps": warmup_steps,
                      "measured_steps": measured_steps, "time_budget_seconds": 600})
    assert result["outcome"] == "ok", result
    return result


# --- the row claims what ran --------------------------------------------------------------------------------

def test_grad_accum_runs_every_micro_batch_and_counts_its_tokens() -> None:
    """grad_accum_steps: 3 was recorded in the row but each step ran one micro-batch: tokens/s and the peak
    (gradients held across micro-batches) were those of grad_accum_steps: 1."""
    result = _run_in_process(_tiny(grad_accum_steps=3), warmup_steps=1, measured_steps=2)
    assert result["micro_batches"] == (1 + result["measured_steps"]) * 3
    tokens = result["tokens_per_second"] * sum(result["step_seconds"])
    assert tokens == pytest.approx(2 * 16 * 3 * result["measured_steps"], rel=1e-9)


def test_modules_to_save_are_trained_as_the_row_says() -> None:
    """lora.modules_to_save [embed_tokens, lm_head] was recorded in the row but PEFT was not told: only the
    adapters trained (3,584 parameters instead of 3,584 + 2 x 256 x 64)."""
    result = _run_in_process(_tiny(method="lora", lora={"modules_to_save": ["embed_tokens", "lm_head"]}),
                             warmup_steps=0, measured_steps=1)
    adapters = 2 * (8 * (64 + 64) + 8 * (64 + 32))  # q_proj and v_proj (2 kv heads of 16) per layer, rank 8
    assert result["params_trainable"] == adapters + 2 * 256 * 64


def test_modules_to_save_roles_map_to_the_family_names() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from scheduler.calibrate.worker import build_dense_model, saved_module_names

    spec = parse_training_spec({"model": {"name": "g", "config": TINY_GPT2}, "seq_len": 16})
    model = build_dense_model(torch, transformers, spec, TINY_GPT2, torch.device("meta"), torch.float32)
    assert saved_module_names(model, ["embed_tokens", "lm_head"]) == ["transformer.wte", "lm_head"]
    cls = parse_training_spec({"model": {"name": "g", "config": TINY_GPT2}, "seq_len": 16,
                               "task": "seq-classification"})
    head_less = build_dense_model(torch, transformers, cls, TINY_GPT2, torch.device("meta"), torch.float32)
    with pytest.raises(ValueError, match="lm_head"):
        saved_module_names(head_less, ["lm_head"])


def test_a_row_measured_off_its_pinned_gpu_does_not_claim_that_gpu() -> None:
    """A sweep config pinned to H100-80GB and run on CPU was written with spec.gpu H100-80GB and gpu unknown."""
    (config,) = _configs(_tiny(gpu="H100-80GB"))
    row = build_row(config, WorkerOutcome({"outcome": "ok", "tokens_per_second": 10.0}, 1.0), CPU_ENV, "audit")
    (run,) = parse_runs(json.dumps(row))
    assert run.gpu == "unknown" and run.spec.gpu is None
    on_a100 = build_row(config, WorkerOutcome({"outcome": "ok"}, 1.0), A100_ENV, "audit")
    assert on_a100["spec"]["gpu"] == on_a100["gpu"] == "A100-80GB"


def test_oom_row_keeps_what_the_worker_measured_before_the_oom() -> None:
    (config,) = _configs(_tiny())
    result = {"outcome": "oom", "reason": "CUDA out of memory", "peak_allocated_before_oom_bytes": 70 * 2**30,
              "peak_reserved_before_oom_bytes": 78 * 2**30}
    row = build_row(config, WorkerOutcome(result, 1.0), H100_ENV, "audit")
    (run,) = parse_runs(json.dumps(row))
    assert run.measured.oom and run.measured.peak_bytes is None and run.quality == "high"
    assert row["measured"]["peak_allocated_before_oom_bytes"] == 70 * 2**30
    assert row["measured"]["peak_reserved_before_oom_bytes"] == 78 * 2**30


def test_a_cublas_allocation_failure_is_an_oom() -> None:
    torch = pytest.importorskip("torch")
    from scheduler.calibrate.worker import _is_oom

    cublas = RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")
    assert _is_oom(torch, cublas)
    assert _is_oom(torch, RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not _is_oom(torch, RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


# --- the output file ----------------------------------------------------------------------------------------

def _fake_gpu_worker(tmp_path: Path, environment: dict[str, Any]) -> RunnerOptions:
    """A stand-in worker process: answers the probe with ``environment`` and every config with a measurement."""
    result = {"outcome": "ok", "environment": environment, "peak_allocated_bytes": 2**30,
              "peak_reserved_bytes": 2**31, "tokens_per_second": 100.0, "warmup_steps": 1, "measured_steps": 1}
    script = tmp_path / "fake-python"
    script.write_text(f"#!{sys.executable}\nimport json, sys\njson.load(sys.stdin)\n"
                      f"print({RESULT_PREFIX!r} + {json.dumps(json.dumps(result))})\n", encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return RunnerOptions(python_executable=str(script), timeout_seconds=60)


@pytest.fixture
def packages_present(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in worker needs no torch; the parent's check for it is what this turns off."""
    monkeypatch.setattr(runner_module, "missing_packages", lambda: [])


@pytest.mark.usefixtures("packages_present")
def test_resume_after_a_cut_off_last_line_keeps_every_row(tmp_path: Path) -> None:
    """A row cut off mid-write (kill, full disk) had the next row appended onto it: both were lost and the file
    no longer parsed as reference runs."""
    first, second = _configs(_tiny(), _tiny(seq_len=32))
    options = _fake_gpu_worker(tmp_path, H100_ENV)
    out = tmp_path / "H100-80GB.jsonl"
    row = build_row(first, WorkerOutcome({"outcome": "ok", "tokens_per_second": 1.0}, 1.0), H100_ENV, "audit")
    out.write_text(json.dumps(row) + "\n" + json.dumps(row)[:57], encoding="utf-8")
    log: list[str] = []
    summary = run_sweep([first, second], out, "audit", options, resume=True, log=log.append)
    assert len(summary.rows) == 1
    runs = parse_runs(out.read_text(encoding="utf-8"))
    ids = [json.loads(line)["calibration"]["config_id"] for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(runs) == 2 and ids == [first.config_id, second.config_id]
    assert any("cut-off last line" in line for line in log)


@pytest.mark.usefixtures("packages_present")
def test_resume_keeps_a_complete_last_row_that_lacks_its_line_end(tmp_path: Path) -> None:
    first, second = _configs(_tiny(), _tiny(seq_len=32))
    out = tmp_path / "H100-80GB.jsonl"
    row = build_row(first, WorkerOutcome({"outcome": "ok", "tokens_per_second": 1.0}, 1.0), H100_ENV, "audit")
    out.write_text(json.dumps(row), encoding="utf-8")
    run_sweep([first, second], out, "audit", _fake_gpu_worker(tmp_path, H100_ENV), resume=True, log=lambda _: None)
    assert len(parse_runs(out.read_text(encoding="utf-8"))) == 2


@pytest.mark.usefixtures("packages_present")
def test_resume_refuses_a_file_measured_on_another_device(tmp_path: Path) -> None:
    """Resuming an A100 file on an H100 skipped the configs measured on the A100 and appended H100 rows to it."""
    first, second = _configs(_tiny(), _tiny(seq_len=32))
    out = tmp_path / "A100-80GB.jsonl"
    row = build_row(first, WorkerOutcome({"outcome": "ok", "tokens_per_second": 1.0}, 1.0), A100_ENV, "audit")
    out.write_text(json.dumps(row) + "\n", encoding="utf-8")
    before = out.read_text(encoding="utf-8")
    with pytest.raises(CalibrateError, match=r"another device \(1 on NVIDIA A100-SXM4-80GB\).*NVIDIA H100"):
        run_sweep([first, second], out, "audit", _fake_gpu_worker(tmp_path, H100_ENV), resume=True,
                  log=lambda _: None)
    assert out.read_text(encoding="utf-8") == before


@pytest.mark.parametrize("resume", [False, True])
def test_out_that_is_a_directory_is_a_clear_error(resume: bool, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"name": "audit", "configs": [_tiny()]}), encoding="utf-8")
    folder = tmp_path / "rows"
    folder.mkdir()
    code = cli_main(["calibrate", "--sweep", str(sweep), "--out", str(folder), "--device", "cpu",
                     *(["--resume"] if resume else [])])
    assert code == 2
    assert f"--out {folder} is not a file" in capsys.readouterr().err


@pytest.mark.usefixtures("packages_present")
def test_out_that_cannot_be_created_fails_before_any_worker(tmp_path: Path) -> None:
    """An --out under a file (or a read-only folder) was found only after the first config had run for
    minutes, as a traceback."""
    (config,) = _configs(_tiny())
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("", encoding="utf-8")
    options = RunnerOptions(python_executable=str(tmp_path / "no-such-python"))  # a started worker would crash
    with pytest.raises(CalibrateError, match="cannot write --out"):
        run_sweep([config], blocker / "rows.jsonl", "audit", options, log=lambda _: None)


def test_a_worker_that_hangs_after_its_result_keeps_its_measurement(tmp_path: Path) -> None:
    """A worker that printed its result and then did not exit (a hang in CUDA teardown) was recorded as a
    timeout: the measurement it had printed was thrown away."""
    from scheduler.calibrate.runner import run_worker

    script = tmp_path / "fake-python"
    result = {"outcome": "ok", "tokens_per_second": 5.0}
    script.write_text(f"#!{sys.executable}\nimport json, sys, time\njson.load(sys.stdin)\n"
                      f"print({RESULT_PREFIX!r} + {json.dumps(json.dumps(result))}, flush=True)\ntime.sleep(60)\n",
                      encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    outcome = run_worker({"mode": "run"}, RunnerOptions(python_executable=str(script)), timeout_seconds=2)
    assert outcome.result["outcome"] == "ok" and outcome.result["tokens_per_second"] == 5.0
    assert any("did not exit" in note for note in outcome.result["notes"])
