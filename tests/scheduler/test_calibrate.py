"""The calibration harness: sweep expansion, LoRA role mapping, skip rules, row building, the process runner
(with stand-in workers, no torch) and one real end-to-end CPU sweep (needs the calibrate extra)."""

from __future__ import annotations

import io
import json
import stat
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from predictors.catalog import resolve_model
from predictors.errors import SpecError
from predictors.reference import parse_runs
from predictors.spec import parse_training_spec
from scheduler.calibrate import nvml as nvml_module
from scheduler.calibrate import runner as runner_module
from scheduler.calibrate import worker as worker_module
from scheduler.calibrate.nvml import NvmlPeakSampler
from scheduler.calibrate.runner import (
    CalibrateError,
    RunnerOptions,
    WorkerOutcome,
    build_row,
    drop_failed_rows,
    existing_config_ids,
    parse_worker_output,
    run_sweep,
    run_worker,
)
from scheduler.calibrate.sweep import SweepConfig, expand_sweep, load_sweep, parse_sweep, scale_config
from scheduler.calibrate.worker import (
    PREIMPORT_ENV,
    RESULT_PREFIX,
    build_dense_model,
    hf_config_fields,
    lora_target_names,
    skip_reason,
)
from scheduler.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SWEEP = ROOT / "bench" / "sweeps" / "default.yaml"
SMOKE_SWEEP = ROOT / "bench" / "sweeps" / "cpu-smoke.yaml"

TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256,
              "max_position_embeddings": 256}
TINY_GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256, "n_inner": 256,
             "vocab_size": 256}


def _configs(data: dict[str, Any]) -> list[SweepConfig]:
    return expand_sweep(parse_sweep(data))


# --- sweep expansion ---------------------------------------------------------------------------------------

def test_grid_is_a_product_with_dotted_axes_and_inapplicable_settings_dropped() -> None:
    configs = _configs({
        "name": "t",
        "base": {"seq_len": 128, "lora": {"rank": 4}},
        "grids": [{"name": "g", "axes": {"model": ["gpt2", "llama-3.2-1b"], "method": ["full", "lora"],
                                          "lora.alpha": [8, 32]}}],
    })
    # full ignores lora.alpha, so its two alpha values collapse into one config
    assert len(configs) == 2 * (1 + 2)
    full = [c for c in configs if c.spec.method == "full"]
    assert all("lora" not in c.spec_dict for c in full)
    lora = [c for c in configs if c.spec.method == "lora"]
    assert {c.spec_dict["lora"]["alpha"] for c in lora} == {8, 32}
    assert all(c.spec_dict["lora"]["rank"] == 4 for c in lora), "dotted axes merge into the base mapping"
    assert all(c.spec_dict["model"]["config"]["model_type"] in ("gpt2", "llama") for c in configs)


def test_ids_are_stable_under_reordering_and_regrouping() -> None:
    one = _configs({"name": "a", "grids": [{"name": "x", "axes": {"model": ["gpt2", "gpt2-medium"]}}]})
    two = _configs({"name": "b", "configs": [{"model": "gpt2-medium"}, {"model": "gpt2"}]})
    assert sorted(c.config_id for c in one) == sorted(c.config_id for c in two)
    assert len({c.config_id for c in one}) == 2


def test_scaled_variants_set_every_layer_key() -> None:
    configs = _configs({"name": "s", "models": {
        "gpt2-xl-4l": {"from": "gpt2-xl", "layers": 4},
        "llama-8b-2l": {"from": "llama-3.1-8b", "layers": 2, "override": {"vocab_size": 32000}},
    }, "grids": [{"name": "g", "axes": {"model": ["gpt2-xl-4l", "llama-8b-2l"]}}]})
    gpt2, llama = (c.spec_dict["model"]["config"] for c in configs)
    assert gpt2["n_layer"] == 4 and gpt2.get("num_hidden_layers", 4) == 4
    assert llama["num_hidden_layers"] == 2 and llama["vocab_size"] == 32000
    assert resolve_model(configs[1].spec).architecture.num_layers == 2
    assert scale_config({"layer_types": ["a", "b"], "num_hidden_layers": 2}, 3, {})["layer_types"] == ["a", "b", "a"]


def test_every_bad_config_is_reported_with_its_path() -> None:
    data = {"name": "bad", "grids": [{"name": "g", "axes": {"model": ["gpt2"], "seq_len": [-1]}}],
            "configs": [{"model": "gpt2", "precision": "fp8"}, {"model": "no-such-model-xyz"}]}
    with pytest.raises(SpecError) as err:
        _configs(data)
    paths = [p.path for p in err.value.problems]
    assert len(paths) == 3
    assert any(p.startswith("grids[0](g).combination[0]") and "seq_len" in p for p in paths)
    assert any(p.startswith("configs[0]") and "precision" in p for p in paths)
    assert any(p.startswith("configs[1]") for p in paths)


@pytest.mark.parametrize("data", [
    {"name": "x", "grid": []},
    {"name": "x", "grids": [{"name": "g", "axes": {"seq_len": []}}]},
    {"name": "x", "models": {"m": {"from": "gpt2", "config": {}}}},
    {"name": "x", "settings": {"measured_steps": 0}},
])
def test_sweep_schema_is_strict(data: dict[str, Any]) -> None:
    with pytest.raises(SpecError):
        parse_sweep(data)


def test_gpu_job_script_names_every_group_of_the_default_sweep() -> None:
    """bench/gpu_calibrate.sh runs the groups it lists, in that order: a group it does not list is never measured
    on a lent GPU, and a name that is not a group selects nothing."""
    import re
    import shlex

    script = (ROOT / "bench" / "gpu_calibrate.sh").read_text(encoding="utf-8")
    listed = re.search(r"GROUPS_IN_ORDER=\(([^)]*)\)", script)
    assert listed is not None
    names = shlex.split(listed.group(1))
    _, configs = load_sweep(DEFAULT_SWEEP)
    groups = {c.group for c in configs}
    assert len(names) == len(set(names))
    assert set(names) == groups


def test_default_sweep_covers_the_issue() -> None:
    _, configs = load_sweep(DEFAULT_SWEEP)
    assert len(configs) >= 60
    specs = [c.spec for c in configs]
    assert {s.method for s in specs} == {"full", "lora", "qlora"}
    assert {"bf16-true", "bf16-mixed"} <= {s.precision for s in specs}
    assert {"adamw", "adamw-8bit"} <= {s.optimizer for s in specs}
    assert {"none", "full"} <= {s.gradient_checkpointing for s in specs}
    assert {"sdpa", "eager"} <= {s.attention for s in specs}
    seq_lens = {s.seq_len for s in specs}
    assert min(seq_lens) <= 256 and max(seq_lens) >= 8192
    types = {c.spec_dict["model"]["config"]["model_type"] for c in configs}
    assert {"gpt2", "llama", "qwen2", "gemma2"} <= types
    params = {c.config_id: resolve_model(c.spec).params_total for c in configs}
    assert min(params.values()) < 0.2e9 and 7e9 < max(params.values()) < 8.5e9
    # per-layer scaling: one base architecture measured at several depths with everything else fixed
    scaled = [c for c in configs if c.group.startswith("scaled-layers")]
    depths = {c.spec_dict["model"]["config"]["num_hidden_layers"] for c in scaled}
    assert len(scaled) >= 10 and len(depths) >= 4
    assert all(c.spec.gpus == 1 for c in configs)
    mbs = {s.micro_batch_size for s in specs}
    assert len(mbs) >= 3


def test_default_sweep_models_build_in_transformers_with_the_catalog_counts() -> None:
    """Every model of the default sweep instantiates (on the meta device: no memory) under the installed
    transformers with the attention it asks for, its LoRA roles resolve to modules, and a causal LM has the
    parameter count the predictor computes from the same config."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.pytorch_utils import Conv1D

    _, configs = load_sweep(DEFAULT_SWEEP)
    built: dict[str, Any] = {}
    for config in configs:
        spec = config.spec
        if spec.attention == "flash":  # flash-attn is not installed in CI; the model shape is the same
            spec = spec.model_copy(update={"attention": "sdpa"})
        key = json.dumps([config.spec_dict["model"], spec.task, spec.attention], sort_keys=True)
        if key not in built:
            model = build_dense_model(torch, transformers, spec, config.spec_dict["model"]["config"],
                                      torch.device("meta"), torch.bfloat16)
            built[key] = model
            if spec.task == "causal-lm":
                count = sum(p.numel() for p in model.parameters())
                assert count == resolve_model(spec).params_total, config.summary
        lora = spec.resolved_lora
        if lora is not None and lora.target_modules != "all-linear":
            names = [n for n, m in built[key].named_modules() if isinstance(m, torch.nn.Linear | Conv1D)]
            assert lora_target_names(names, lora.target_modules)[0]


def test_smoke_sweep_is_tiny() -> None:
    _, configs = load_sweep(SMOKE_SWEEP)
    assert 2 <= len(configs) <= 6
    assert all(c.spec_dict["model"]["config"].get("hidden_size", 64) <= 64 for c in configs)


# --- worker helpers (no torch) -----------------------------------------------------------------------------

LLAMA_NAMES = [f"model.layers.0.{m}" for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                               "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                               "mlp.down_proj")] + ["lm_head"]
GPT2_NAMES = ["transformer.h.0.attn.c_attn", "transformer.h.0.attn.c_proj", "transformer.h.0.mlp.c_fc",
              "transformer.h.0.mlp.c_proj", "lm_head"]
BERT_NAMES = ["bert.encoder.layer.0.attention.self.query", "bert.encoder.layer.0.attention.self.key",
              "bert.encoder.layer.0.attention.self.value", "bert.encoder.layer.0.attention.output.dense",
              "bert.encoder.layer.0.intermediate.dense", "bert.encoder.layer.0.output.dense"]
PHI3_NAMES = ["model.layers.0.self_attn.qkv_proj", "model.layers.0.self_attn.o_proj",
              "model.layers.0.mlp.gate_up_proj", "model.layers.0.mlp.down_proj"]


@pytest.mark.parametrize(("names", "roles", "expected", "fused"), [
    (LLAMA_NAMES, ["q_proj", "v_proj"], ["self_attn.q_proj", "self_attn.v_proj"], False),
    (LLAMA_NAMES, ["down_proj", "lm_head"], ["mlp.down_proj", "lm_head"], False),
    (GPT2_NAMES, ["q_proj", "v_proj"], ["attn.c_attn"], True),
    (GPT2_NAMES, ["o_proj", "down_proj"], ["attn.c_proj", "mlp.c_proj"], False),
    (BERT_NAMES, ["o_proj"], ["attention.output.dense"], False),
    (BERT_NAMES, ["down_proj"], ["0.output.dense"], False),
    (PHI3_NAMES, ["q_proj", "k_proj", "v_proj", "up_proj"], ["qkv_proj", "gate_up_proj"], True),
])
def test_lora_roles_map_to_family_module_names(names: list[str], roles: list[str], expected: list[str],
                                               fused: bool) -> None:
    targets, notes = lora_target_names(names, roles)
    assert len(targets) == len(expected)
    assert all(t.endswith(e) for t, e in zip(targets, expected, strict=True))
    assert bool(notes) == fused


def test_lora_roles_unknown_to_the_family_are_an_error() -> None:
    with pytest.raises(ValueError, match="all-linear"):
        lora_target_names(GPT2_NAMES, ["gate_proj"])


def _spec(**fields: Any) -> Any:
    return parse_training_spec({"model": {"name": "t", "config": TINY_LLAMA}, **fields})


ALL_INSTALLED = {"bitsandbytes": "0.45", "flash_attn": "2.7", "torchao": "0.9"}


@pytest.mark.parametrize(("fields", "device", "installed", "expect"), [
    ({}, "cpu", {}, None),
    ({"method": "qlora"}, "cpu", ALL_INSTALLED, "CUDA"),
    ({"method": "qlora"}, "cuda", {}, "bitsandbytes"),
    ({"method": "qlora"}, "cuda", ALL_INSTALLED, None),
    ({"method": "qlora", "quantization": "gptq-int4"}, "cuda", ALL_INSTALLED, "gptq-int4"),
    ({"optimizer": "adamw-8bit"}, "cpu", ALL_INSTALLED, "CUDA"),
    ({"optimizer": "paged-adamw-8bit"}, "cuda", ALL_INSTALLED, None),
    ({"attention": "flash"}, "cuda", {}, "flash-attn"),
    ({"gradient_checkpointing": "selective"}, "cuda", ALL_INSTALLED, "selective"),
    ({"gpus": 2}, "cuda", ALL_INSTALLED, "multi-GPU"),
    ({"offload": "optimizer"}, "cuda", ALL_INSTALLED, "offload"),
    ({"precision": "16-mixed"}, "cpu", {}, "CUDA"),
    ({"optimizer_in_backward": True, "cross_entropy": "chunked", "fused_optimizer": True}, "cpu", {}, None),
    ({"optimizer_in_backward": True, "precision": "16-mixed"}, "cuda", ALL_INSTALLED, "loss scaling"),
    ({"torch_compile": True}, "cuda", ALL_INSTALLED, "torch_compile"),
    ({"sequence_lengths": "variable"}, "cuda", ALL_INSTALLED, "bench/variable_lengths.py"),
    ({"expandable_segments": True}, "cuda", ALL_INSTALLED, "bench/variable_lengths.py"),
    ({"activation_offloading": True, "gradient_checkpointing": "full"}, "cuda", {**ALL_INSTALLED,
     "transformers": "5.17.0"}, "transformers >= 5.24"),
    ({"checkpoint_every_n_layers": 2, "gradient_checkpointing": "full"}, "cuda", ALL_INSTALLED, "transformers >= 5.24"),
    ({"activation_offloading": True}, "cuda", {**ALL_INSTALLED, "transformers": "5.24.0"}, "checkpointed blocks only"),
    ({"activation_offloading": True, "checkpoint_every_n_layers": 3, "gradient_checkpointing": "full"}, "cuda",
     {**ALL_INSTALLED, "transformers": "5.24.0"}, None),
    ({"activation_offloading": True, "gradient_checkpointing": "full"}, "cpu", {"transformers": "5.24.0"}, "CUDA only"),
    ({"checkpoint_every_n_layers": 2, "gradient_checkpointing": "full"}, "cpu", {"transformers": "6.0.0.dev0"}, None),
    ({"cross_entropy": "fused-linear"}, "cuda", ALL_INSTALLED, "liger-kernel"),
    ({"cross_entropy": "fused-linear"}, "cuda", {**ALL_INSTALLED, "liger_kernel": "0.6"}, None),
    ({"cross_entropy": "chunked", "task": "masked-lm"}, "cuda", ALL_INSTALLED, "causal-lm only"),
    ({"reference_model": True}, "cuda", ALL_INSTALLED, "frozen reference copy"),
    ({"reference_model": True, "method": "lora"}, "cuda", ALL_INSTALLED, None),  # the base, adapter disabled
    ({"teacher_model": "llama-3.1-8b"}, "cuda", ALL_INSTALLED, "no distillation loop"),
    ({"galore_rank": 8}, "cuda", ALL_INSTALLED, "galore_torch"),
    ({"trainable_layers": 1}, "cuda", ALL_INSTALLED, "no freeze tuning"),
])
def test_skip_reasons(fields: dict[str, Any], device: str, installed: dict[str, str], expect: str | None) -> None:
    reason = skip_reason(_spec(**fields), TINY_LLAMA, device, installed)
    assert (reason is None) if expect is None else (reason is not None and expect in reason)


def test_learned_positions_are_not_stretched_but_rope_is() -> None:
    gpt2 = parse_training_spec({"model": {"name": "g", "config": TINY_GPT2}, "seq_len": 512})
    assert "learned positions" in (skip_reason(gpt2, TINY_GPT2, "cuda", {}) or "")
    llama = _spec(seq_len=4096, task="seq-classification")
    model_type, fields = hf_config_fields(TINY_LLAMA, llama)
    assert model_type == "llama" and fields["max_position_embeddings"] == 4096
    assert fields["num_labels"] == 2 and fields["pad_token_id"] == 0 and fields["use_cache"] is False
    _, gpt2_fields = hf_config_fields({"model_type": "gpt2", "intermediate_size": 96}, gpt2)
    assert gpt2_fields["n_inner"] == 96


# --- rows ---------------------------------------------------------------------------------------------------

CUDA_ENV = {"device": "cuda", "gpu_name": "NVIDIA H100 80GB HBM3", "torch": "2.5.1+cu124",
            "transformers": "4.46.0", "peft": "0.13.0", "bitsandbytes": "0.44.1", "driver": "550.54.15",
            "cuda": "12.4"}
CPU_ENV = {"device": "cpu", "gpu_name": None, "torch": "2.5.1+cpu", "transformers": "4.46.0", "peft": "0.13.0"}


def _one_config() -> SweepConfig:
    return _configs({"name": "t", "configs": [{"model": {"name": "tiny", "config": TINY_LLAMA}, "seq_len": 64}]})[0]


def test_gpu_row_is_high_quality_with_memory_and_catalog_gpu() -> None:
    result = {"outcome": "ok", "peak_allocated_bytes": 10 * 2**30, "peak_reserved_bytes": 11 * 2**30,
              "peak_nvml_bytes": 12 * 2**30, "tokens_per_second": 5000.0, "warmup_steps": 2, "measured_steps": 3}
    row = build_row(_one_config(), WorkerOutcome(result, 12.0), CUDA_ENV, "t")
    (run,) = parse_runs(json.dumps(row))
    assert run.gpu == "H100-80GB" and run.spec.gpu == "H100-80GB" and run.quality == "high"
    assert run.measured.peak_bytes == 10 * 2**30 and run.measured.metric == "allocated"
    assert row["measured"]["peak_reserved_bytes"] == 11 * 2**30 and row["measured"]["peak_nvml_bytes"] == 12 * 2**30
    assert run.measured.tokens_per_second_scope == "per_gpu"
    assert row["id"].startswith("CAL-") and len(row["id"]) == 12
    assert row["environment"]["driver"] == "550.54.15"
    # the worker trains with transformers: the row's spec says so, while the config id stays the sweep spec's
    config = _one_config()
    assert run.spec.framework == "transformers" and "framework" not in config.spec_dict
    assert row["calibration"]["config_id"] == config.config_id


@pytest.mark.parametrize(("env", "result", "quality", "oom", "tokens"), [
    (CPU_ENV, {"outcome": "ok", "peak_allocated_bytes": 5, "tokens_per_second": 10.0}, "low", False, 10.0),
    (CUDA_ENV, {"outcome": "oom", "reason": "CUDA out of memory"}, "high", True, None),
    (CUDA_ENV, {"outcome": "timeout", "reason": "exceeded"}, "low", False, None),
    (CUDA_ENV, {"outcome": "crash", "reason": "boom"}, "low", False, None),
    (CPU_ENV, {"outcome": "skipped", "reason": "qlora needs CUDA"}, "low", False, None),
])
def test_rows_without_gpu_memory(env: dict[str, Any], result: dict[str, Any], quality: str, oom: bool,
                                 tokens: float | None) -> None:
    row = build_row(_one_config(), WorkerOutcome(result, 1.0), env, "t")
    (run,) = parse_runs(json.dumps(row))
    assert run.measured.peak_bytes is None and row["measured"]["peak_reserved_bytes"] is None
    assert run.quality == quality and run.measured.oom is oom and run.measured.tokens_per_second == tokens
    assert row["calibration"]["outcome"] == result["outcome"]


def test_same_config_on_two_devices_gets_two_ids() -> None:
    config = _one_config()
    ok = WorkerOutcome({"outcome": "ok", "tokens_per_second": 1.0}, 1.0)
    assert build_row(config, ok, CUDA_ENV, "t")["id"] != build_row(config, ok, CPU_ENV, "t")["id"]


def test_worker_output_is_found_among_library_noise() -> None:
    stdout = f"loading...\n{RESULT_PREFIX}{json.dumps({'outcome': 'ok'})}\nwarning: late print\n"
    assert parse_worker_output(stdout) == {"outcome": "ok"}
    assert parse_worker_output("nothing here\n") is None
    assert parse_worker_output(f"{RESULT_PREFIX}{{not json\n") is None


def test_resume_reads_ids_and_retry_drops_only_failures(tmp_path: Path) -> None:
    out = tmp_path / "runs.jsonl"
    rows = [{"calibration": {"config_id": cid, "outcome": kind}}
            for cid, kind in (("a", "ok"), ("b", "crash"), ("c", "oom"), ("d", "timeout"), ("e", "skipped"))]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"cut off', encoding="utf-8")
    assert existing_config_ids(out) == {"a", "b", "c", "d", "e"}
    assert drop_failed_rows(out) == 3
    assert existing_config_ids(out) == {"a", "c", "e"}
    assert drop_failed_rows(out) == 0
    # a measured row with a typo in the middle is kept for the user to fix, not deleted as a crash row
    typo = '{"calibration": {"config_id": "f", "outcome": "ok"},, "measured": {}}\n'
    out.write_text(typo + json.dumps({"calibration": {"config_id": "g", "outcome": "crash"}}) + "\n",
                   encoding="utf-8")
    assert drop_failed_rows(out) == 1
    assert out.read_text(encoding="utf-8") == typo


class _FakeNvml:
    """Stands in for pynvml: a device whose used memory rises then falls."""

    def __init__(self, readings_bytes: list[int]) -> None:
        self.readings_bytes = readings_bytes
        self.calls = 0

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        assert uuid.startswith("GPU-")
        return uuid

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> Any:
        value = self.readings_bytes[min(self.calls, len(self.readings_bytes) - 1)]
        self.calls += 1
        return type("Info", (), {"used": value})()


def test_nvml_sampler_keeps_the_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeNvml([100, 300, 900, 200])
    monkeypatch.setattr(nvml_module, "load_pynvml", lambda: fake)
    with NvmlPeakSampler(uuid="abc", interval_seconds=0.001) as sampler:
        while fake.calls < 5:
            time.sleep(0.001)
    assert sampler.baseline_used_bytes == 100 and sampler.peak_used_bytes == 900 and sampler.samples >= 3


def test_nvml_sampler_without_nvml_reports_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml_module, "load_pynvml", lambda: None)
    with NvmlPeakSampler() as sampler:
        pass
    assert sampler.peak_used_bytes is None and sampler.baseline_used_bytes is None


def test_worker_without_torch_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_torch(name: str) -> Any:
        raise ImportError(f"No module named {name!r}", name=name)

    monkeypatch.setattr(worker_module.importlib, "import_module", no_torch)
    lines: list[str] = []
    code = worker_module.main(stdin=io.StringIO('{"mode": "probe"}'), emit=lines.append)
    result = parse_worker_output("\n".join(lines))
    assert code == 1 and result is not None and result["outcome"] == "crash"
    assert "vramfit[calibrate]" in result["reason"] and "torch" in result["reason"]


# --- the process runner with stand-in workers (no torch) ---------------------------------------------------

def _fake_worker(tmp_path: Path, body: str) -> RunnerOptions:
    script = tmp_path / "fake-python"
    script.write_text(f"#!{sys.executable}\nimport json, os, signal, sys, time\njob = json.load(sys.stdin)\n{body}\n",
                      encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return RunnerOptions(python_executable=str(script), timeout_seconds=30)


@pytest.mark.parametrize(("body", "outcome", "reason_part"), [
    (f"print('noise'); print({RESULT_PREFIX!r} + json.dumps({{'outcome': 'ok', 'tokens_per_second': 3.0}}))",
     "ok", None),
    ("sys.stderr.write('Traceback\\nValueError: bad config\\n'); sys.exit(3)", "crash", "bad config"),
    ("os.kill(os.getpid(), signal.SIGKILL)", "crash", "signal 9"),
    ("time.sleep(60)", "timeout", "budget of 1 s"),
])
def test_run_worker_outcomes(tmp_path: Path, body: str, outcome: str, reason_part: str | None) -> None:
    options = _fake_worker(tmp_path, body)
    result = run_worker({"mode": "run"}, options, timeout_seconds=1 if outcome == "timeout" else 30)
    assert result.result["outcome"] == outcome
    if reason_part:
        assert reason_part in result.result["reason"]


def test_sweep_refuses_to_overwrite_and_to_start_without_packages(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "runs.jsonl"
    out.write_text('{"calibration": {"config_id": "zzz", "outcome": "ok"}}\n', encoding="utf-8")
    with pytest.raises(CalibrateError, match="--resume"):
        run_sweep([_one_config()], out, "t", RunnerOptions())
    monkeypatch.setattr(runner_module, "missing_packages", lambda: ["torch"])
    with pytest.raises(CalibrateError, match=r"vramfit\[calibrate\]"):
        run_sweep([_one_config()], out, "t", RunnerOptions(), resume=True)
    assert out.read_text(encoding="utf-8").count("\n") == 1  # a file it did not create is left as it was
    fresh = tmp_path / "new" / "rows.jsonl"
    with pytest.raises(CalibrateError, match=r"vramfit\[calibrate\]"):
        run_sweep([_one_config()], fresh, "t", RunnerOptions())
    assert not fresh.exists()  # no empty file left behind


def test_cli_lists_without_torch(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["calibrate", "--sweep", str(SMOKE_SWEEP), "--list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(load_sweep(SMOKE_SWEEP)[1])
    assert cli_main(["calibrate", "--sweep", str(SMOKE_SWEEP)]) == 2


# --- end to end on CPU: the real runner, subprocesses and worker ------------------------------------------

@pytest.mark.slow
def test_cpu_sweep_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    sweep = {
        "name": "e2e",
        "settings": {"warmup_steps": 1, "measured_steps": 2, "timeout_seconds": 120},
        "models": {"tiny-llama": {"config": TINY_LLAMA}, "tiny-gpt2": {"config": TINY_GPT2}},
        "base": {"precision": "bf16-true", "micro_batch_size": 2, "seq_len": 32},
        "grids": [
            {"name": "works", "axes": {"model": ["tiny-llama"]}, "base": {"method": "lora"}},
            {"name": "works-full", "axes": {"model": ["tiny-gpt2"]}},
            {"name": "too-slow", "timeout_seconds": 1, "axes": {"model": ["tiny-llama"], "seq_len": [48]}},
        ],
        "configs": [{"model": {"name": "broken", "config": {"model_type": "no-such-architecture"}}}],
    }
    sweep_path = tmp_path / "sweep.yaml"
    sweep_path.write_text(yaml.safe_dump(sweep), encoding="utf-8")
    out = tmp_path / "runs.jsonl"
    assert cli_main(["calibrate", "--sweep", str(sweep_path), "--out", str(out)]) == 0
    runs = parse_runs(out.read_text(encoding="utf-8"))
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    by_group: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_group.setdefault(row["calibration"]["group"], []).append(row)
    assert len(runs) == 4
    (lora,), (full,) = by_group["works"], by_group["works-full"]
    for row in (lora, full):
        measured = row["measured"]
        assert row["calibration"]["outcome"] == "ok"
        assert measured["tokens_per_second"] > 0 and measured["measured_steps"] == 2
        assert measured["peak_bytes"] is None and measured["peak_reserved_bytes"] is None
        assert measured["peak_nvml_bytes"] is None and measured["device"] == "cpu"
        assert row["environment"]["torch"] and row["environment"]["peft"] and row["quality"] == "low"
    assert 0 < lora["measured"]["params_trainable"] < lora["measured"]["params_total"], "LoRA trains adapters"
    assert full["measured"]["params_trainable"] == full["measured"]["params_total"]
    assert by_group["too-slow"][0]["calibration"]["outcome"] == "timeout"
    (broken,) = by_group["configs"]
    assert broken["calibration"]["outcome"] == "crash" and "no-such-architecture" in broken["calibration"]["reason"]

    # resume: nothing left to run, no worker started, the file is unchanged
    before = out.read_text(encoding="utf-8")

    def no_worker(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("--resume with every config in the file started a worker")

    monkeypatch.setattr(runner_module, "run_worker", no_worker)
    assert cli_main(["calibrate", "--sweep", str(sweep_path), "--out", str(out), "--resume"]) == 0
    assert out.read_text(encoding="utf-8") == before
    assert "4 configs already in" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--only", "nope"], "`--only` no config id or group 'nope' in the sweep"),
        (["--limit", "0"], "`--limit` must be a positive number of configs"),
        (["--warmup-steps", "-1"], "`--warmup-steps` must be greater than or equal to 0"),
        (["--measured-steps", "0"], "`--measured-steps` must be a positive integer"),
        (["--timeout-seconds", "0"], "`--timeout-seconds` must be greater than 0"),
        (["--timeout-seconds", "nan"], "`--timeout-seconds` must be a finite number"),
    ],
)
def test_calibrate_flags_obey_the_sweep_settings_limits(flags: list[str], message: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A flag that would make every config fail or select nothing is an input error before anything runs."""
    from scheduler.cli import main as cli_main

    out = tmp_path / "rows.jsonl"
    assert cli_main(["calibrate", "--sweep", str(SMOKE_SWEEP), "--out", str(out), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_gpu_sweep_prestarts_one_spare_worker_and_kills_the_last(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU host each config runs in a worker started (and importing) while the previous config ran;
    the spare left over at the end is killed, and the probe worker is not a pre-importing one."""
    log = tmp_path / "workers.log"
    body = (f"open({str(log)!r}, 'a').write(f\"{{os.getpid()}} {{os.environ.get('{PREIMPORT_ENV}', '-')}} "
            f"{{job['mode']}}\\n\")\n"
            f"print({RESULT_PREFIX!r} + json.dumps({{'outcome': 'ok', 'environment': {{'device': 'cuda'}}, "
            f"'tokens_per_second': 1.0}}))")
    options = _fake_worker(tmp_path, body)
    monkeypatch.setattr(runner_module, "missing_packages", lambda: [])
    monkeypatch.setattr(runner_module.os, "cpu_count", lambda: 16)
    configs = _configs({"name": "t", "configs": [{"model": {"name": "tiny", "config": TINY_LLAMA}, "seq_len": n}
                                                 for n in (32, 64, 128)]})
    out = tmp_path / "runs.jsonl"
    summary = run_sweep(configs, out, "t", options, log=lambda line: None)
    assert summary.outcomes == {"ok": 3} and len(out.read_text(encoding="utf-8").splitlines()) == 3
    entries = [line.split() for line in log.read_text(encoding="utf-8").splitlines()]
    assert [(flag, mode) for _, flag, mode in entries] == [("-", "probe"), ("1", "run"), ("1", "run"), ("1", "run")]
    assert len({pid for pid, _, _ in entries}) == 4  # a fresh process per config


def test_cpu_sweep_starts_no_spare_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "workers.log"
    body = (f"open({str(log)!r}, 'a').write(os.environ.get('{PREIMPORT_ENV}', '-') + '\\n')\n"
            f"print({RESULT_PREFIX!r} + json.dumps({{'outcome': 'ok', 'environment': {{'device': 'cpu'}}, "
            f"'tokens_per_second': 1.0}}))")
    options = _fake_worker(tmp_path, body)
    monkeypatch.setattr(runner_module, "missing_packages", lambda: [])
    configs = _configs({"name": "t", "configs": [{"model": {"name": "tiny", "config": TINY_LLAMA}, "seq_len": n}
                                                 for n in (32, 64)]})
    run_sweep(configs, tmp_path / "runs.jsonl", "t", options, log=lambda line: None)
    assert log.read_text(encoding="utf-8").split() == ["-", "-", "-"]


def test_rows_name_the_host_cpu(tmp_path: Path) -> None:
    """The host bounds small micro-batches (efficiency.yaml's host floor): every row says which CPU it ran on, read
    from /proc/cpuinfo's first "model name", or platform's answer where there is no such file."""
    import platform

    from scheduler.calibrate.worker import cpu_model

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core Processor\n"
                       "\nprocessor\t: 1\nmodel name\t: something else\n", encoding="utf-8")
    assert cpu_model(str(cpuinfo)) == "AMD EPYC 9654 96-Core Processor"
    assert cpu_model(str(tmp_path / "missing")) == (platform.processor() or platform.machine())


# --- the memory-saving switches the harness runs (CPU torch, in this process) ----------------------------------

def _tiny_causal(config: dict[str, Any], **fields: Any) -> tuple[Any, Any, Any, dict[str, Any]]:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    spec = parse_training_spec({"model": {"name": "t", "config": config}, "precision": "32-true", **fields})
    torch.manual_seed(0)
    model = build_dense_model(torch, transformers, spec, config, torch.device("cpu"), torch.float32)
    model.eval()  # no dropout: two forward passes see the same network
    batch = worker_module._batch(torch, spec, 256, torch.device("cpu"))
    return torch, spec, model, batch


@pytest.mark.parametrize(("config", "attention"), [
    (TINY_LLAMA, "sdpa"), (TINY_GPT2, "sdpa"),
    ({**TINY_LLAMA, "model_type": "gemma2", "head_dim": 16, "final_logit_softcapping": 30.0}, "eager"),
], ids=["llama", "gpt2", "gemma2-softcap"])
def test_chunked_loss_equals_the_models_own_loss(config: dict[str, Any], attention: str) -> None:
    torch, spec, model, batch = _tiny_causal(config, cross_entropy="chunked", seq_len=64, attention=attention)
    expected = model(**batch).loss
    chunked = worker_module._loss(torch, model, spec, batch)
    assert float(chunked.detach()) == pytest.approx(float(expected.detach()), rel=1e-5)
    chunked.backward()
    assert model.get_output_embeddings().weight.grad is not None


def test_optimizer_in_backward_updates_every_parameter_and_keeps_no_gradient() -> None:
    torch, spec, model, batch = _tiny_causal(TINY_LLAMA, optimizer_in_backward=True, optimizer="adamw")
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    optimizers = worker_module._in_backward_optimizers(torch, pytest.importorskip("transformers"), spec, params)
    assert len(optimizers) == len(params)
    worker_module._loss(torch, model, spec, batch).backward()
    assert all(p.grad is None for p in params), "each gradient is freed once its parameter is updated"
    assert all(int(opt.state[p]["step"]) == 1 for opt, p in zip(optimizers, params, strict=True))
    assert all(not torch.equal(p, b) for p, b in zip(params, before, strict=True)), "every parameter moved"


@pytest.mark.slow
def test_worker_runs_the_switches_end_to_end_on_cpu() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    spec = {"model": {"name": "t", "config": TINY_LLAMA}, "method": "full", "precision": "bf16-true",
            "micro_batch_size": 2, "seq_len": 32, "optimizer_in_backward": True, "cross_entropy": "chunked",
            "gradient_checkpointing": "full"}
    result = worker_module.run_job({"spec": spec, "device": "cpu", "warmup_steps": 1, "measured_steps": 1})
    assert result["outcome"] == "ok", result
    assert result["tokens_per_second"] > 0 and result["loss"] > 0
    assert any("per-parameter optimizers" in n for n in result["notes"])
    lora = {**spec, "method": "lora", "optimizer_in_backward": False}
    assert worker_module.run_job({"spec": lora, "device": "cpu", "warmup_steps": 1, "measured_steps": 1}
                                 )["outcome"] == "ok"
    # DoRA through PEFT's use_dora: its magnitude vectors train beside the adapters (the sweep's open-dora group)
    dora = {**lora, "lora": {"rank": 4, "target_modules": ["q_proj", "v_proj"], "use_dora": True}}
    result = worker_module.run_job({"spec": dora, "device": "cpu", "warmup_steps": 1, "measured_steps": 1})
    assert result["outcome"] == "ok", result


def test_worker_checkpoints_every_nth_block_and_offloads_their_inputs_on_cpu() -> None:
    """checkpoint_every_n_layers and activation_offloading run through transformers' activation_checkpointing_enable:
    with n = 2 blocks 0 and 2 of 4 are checkpointed (the others not). A training step with every other block
    checkpointed runs on the CPU; offload pins host memory, so its step is measured on CUDA only (a skip here)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("peft")
    if not worker_module._has_layered_checkpointing(getattr(transformers, "__version__", None)):
        pytest.skip("transformers without activation_checkpointing_enable(every_n_layers, offload)")
    config = {**TINY_LLAMA, "num_hidden_layers": 4}
    spec = parse_training_spec({"model": {"name": "t", "config": config}, "method": "full", "precision": "32-true",
                                "micro_batch_size": 2, "seq_len": 32, "gradient_checkpointing": "full",
                                "checkpoint_every_n_layers": 2, "activation_offloading": True})
    model = worker_module.build_dense_model(torch, transformers, spec, config, torch.device("cpu"), torch.float32)
    notes = worker_module._enable_checkpointing(model, spec)
    assert [layer.gradient_checkpointing for layer in model.model.layers] == [True, False, True, False]
    assert any("every_n_layers=2" in n for n in notes) and any("offload=True" in n for n in notes)
    job_spec = {"model": {"name": "t", "config": config}, "method": "full", "precision": "32-true",
                "micro_batch_size": 2, "seq_len": 32, "gradient_checkpointing": "full", "checkpoint_every_n_layers": 2}
    result = worker_module.run_job({"spec": job_spec, "device": "cpu", "warmup_steps": 1, "measured_steps": 1})
    assert result["outcome"] == "ok", result
    assert any("every_n_layers=2" in n for n in result["notes"]), result["notes"]
    offloaded = worker_module.run_job({"spec": {**job_spec, "activation_offloading": True}, "device": "cpu",
                                       "warmup_steps": 1, "measured_steps": 1})
    assert offloaded["outcome"] == "skipped" and "CUDA only" in offloaded["reason"], offloaded
