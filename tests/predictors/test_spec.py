"""TrainingSpec v1 validation: good inputs, defaults, and every error path with its field path."""

from __future__ import annotations

import pytest

from predictors.errors import SpecError
from predictors.spec import parse_training_spec, spec_to_dict
from predictors.units import QuantityError, parse_bytes, parse_count


def test_defaults_follow_the_contract() -> None:
    spec = parse_training_spec({"model": "llama-2-7b"})
    assert (spec.task, spec.method, spec.precision, spec.optimizer) == ("causal-lm", "full", "bf16-mixed", "adamw")
    assert (spec.micro_batch_size, spec.seq_len) == (1, 2048)
    assert (spec.gradient_checkpointing, spec.attention) == ("none", "sdpa")
    assert spec.gpus == 1 and spec.resolved_sharding() == "none" and spec.offload == "none"
    assert spec.resolved_quantization is None and spec.resolved_lora is None


def test_derived_defaults() -> None:
    spec = parse_training_spec({"model": "x", "method": "qlora", "gpus": 8, "tensor_parallel": 2})
    assert spec.resolved_quantization == "nf4-dq"
    assert spec.resolved_lora is not None and spec.resolved_lora.rank == 8
    assert spec.resolved_sharding() == "ddp"
    assert spec.data_parallel() == 4


def test_the_default_lora_settings_are_shared_and_cannot_be_changed() -> None:
    """Specs without a lora block share one default LoraSpec, so it must be immutable."""
    import pydantic

    a = parse_training_spec({"model": "x", "method": "lora"})
    b = parse_training_spec({"model": "y", "method": "qlora"})
    assert a.resolved_lora is b.resolved_lora
    with pytest.raises(pydantic.ValidationError):
        a.resolved_lora.rank = 64  # type: ignore[union-attr]
    assert b.resolved_lora is not None and b.resolved_lora.rank == 8


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("seq_len", "4k", 4096),
        ("seq_len", "2048", 2048),
        ("micro_batch_size", "8", 8),
        ("train_tokens", "1.5e9", 1.5e9),
        ("train_tokens", "2B", 2e9),
        ("train_tokens", "200M", 2e8),
        ("gradient_checkpointing", True, "full"),
        ("gradient_checkpointing", False, "none"),
        ("precision", "BF16-Mixed", "bf16-mixed"),
        ("gpus", "auto", "auto"),
        ("gpus", "16", 16),
        ("gpu", "unknown", None),
    ],
)
def test_accepted_forms(field: str, value: object, expected: object) -> None:
    spec = parse_training_spec({"model": "x", field: value})
    assert getattr(spec, field) == expected


def test_model_mapping_and_lora_modules() -> None:
    spec = parse_training_spec({"model": {"name": "m", "config": {"hidden_size": 8}}, "method": "lora",
                                "lora": {"target_modules": "q_proj, v_proj"}})
    assert spec.resolved_lora is not None and spec.resolved_lora.target_modules == ["q_proj", "v_proj"]
    spec = parse_training_spec({"model": "x", "method": "lora", "lora": {"target_modules": "all-linear"}})
    assert spec.resolved_lora is not None and spec.resolved_lora.target_modules == "all-linear"


def test_every_problem_is_reported_at_once_with_paths() -> None:
    with pytest.raises(SpecError) as info:
        parse_training_spec({"model": "x", "micro_batch_size": -3, "seq_len": "abc", "foo": 1,
                             "precision": "fp8", "lora": {"rank": 0}, "method": "lora"})
    paths = {p.path for p in info.value.problems}
    assert paths == {"spec.micro_batch_size", "spec.seq_len", "spec.foo", "spec.precision", "spec.lora.rank"}
    text = str(info.value)
    assert "`spec.micro_batch_size` must be a positive integer; got -3" in text
    assert "must be one of 32-true, 16-mixed, bf16-mixed, 16-true, bf16-true; got 'fp8'" in text
    assert "`spec.foo` is not a known field" in text and "To fix:" in text


@pytest.mark.parametrize(
    ("data", "path", "fragment"),
    [
        ({}, "spec.model", "is required"),
        ({"model": ""}, "spec.model", "must name a model"),
        ({"model": {"nme": "x"}}, "spec.model.nme", "not a known field"),
        ({"model": {"params": 7e9}}, "spec.model", "needs `name`, `config` or `config_path`"),
        ({"model": "x", "quantization": "nf4"}, "spec", "applies to qlora"),
        ({"model": "x", "method": "lora", "quantization": "nf4"}, "spec", "method is lora"),
        ({"model": "x", "lora": {"rank": 8}}, "spec", "method is full"),
        ({"model": "x", "gpus": 6, "tensor_parallel": 4}, "spec", "multiple of"),
        ({"model": "x", "gpus": 0}, "spec.gpus", "positive"),
        ({"model": "x", "lora": {"target_modules": []}, "method": "lora"}, "spec.lora.target_modules", "at least one"),
        ({"model": "x", "seq_len": "1.5"}, "spec.seq_len", "whole number"),
        ({"model": "x", "seq_len": "1e25"}, "spec.seq_len", "less than or equal to 16777216"),
        ({"model": "x", "micro_batch_size": "1e400"}, "spec.micro_batch_size", "finite number"),
        ({"model": "x", "train_tokens": "1e300T"}, "spec.train_tokens", "too large"),
        ({"model": "x", "deadline_seconds": float("inf")}, "spec.deadline_seconds", "finite number"),
        ({"model": "x", "method": "lora", "lora": {"alpha": float("inf")}}, "spec.lora.alpha", "finite number"),
    ],
)
def test_error_paths(data: dict[str, object], path: str, fragment: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_training_spec(data)
    assert any(p.path == path and fragment in p.message for p in info.value.problems), str(info.value)


@pytest.mark.parametrize("value", [0, -2, 1.5, "foo", True, [1]])
def test_a_bad_gpus_is_one_problem(value: object) -> None:
    """`gpus` is a count or 'auto': a bad value fails both branches, but the user reads one problem (whose
    hint names both forms), not a second "must be 'auto'"."""
    with pytest.raises(SpecError) as info:
        parse_training_spec({"model": "x", "gpus": value})
    problems = [p for p in info.value.problems if p.path == "spec.gpus"]
    assert len(problems) == 1 and "'auto'" in problems[0].hint, str(info.value)
    assert "must be 'auto'" not in problems[0].message


def test_not_a_mapping() -> None:
    with pytest.raises(SpecError, match="must be a mapping"):
        parse_training_spec(["model", "x"])


def test_round_trip_keeps_contract_names() -> None:
    data = {"apiVersion": "vramfit/v1", "kind": "TrainingSpec", "model": "llama-2-7b", "seq_len": 512}
    out = spec_to_dict(parse_training_spec(data))
    assert out["apiVersion"] == "vramfit/v1" and out["seq_len"] == 512
    assert parse_training_spec(out) == parse_training_spec(data)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("80Gi", 80 * 2**30), ("80GiB", 80 * 2**30), ("24GB", 24 * 10**9), ("1.5e9", 1_500_000_000), (512, 512),
     ("512MiB", 512 * 2**20)],
)
def test_parse_bytes(text: object, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["80 parsecs", "", True, float("nan"), [1], "1e400", "1e300Ti", float("inf")])
def test_parse_bytes_rejects(bad: object) -> None:
    with pytest.raises(QuantityError):
        parse_bytes(bad)


def test_parse_count_suffixes() -> None:
    assert parse_count("2k") == 2000
    assert parse_count("2k", binary_k=True) == 2048
    assert parse_count("8Ki") == 8192
    assert parse_count("1T") == 10**12


def test_modules_to_save_extension() -> None:
    """lora.modules_to_save (an extension of v1): other families' module names map to the two roles; a v1 spec
    without it serializes exactly as before; an unknown module is an error with its path."""
    spec = parse_training_spec({"model": "qwen-1_8b", "method": "lora",
                                "lora": {"modules_to_save": "wte, lm_head, output"}})
    assert spec.lora is not None and spec.lora.modules_to_save == ["embed_tokens", "lm_head"]
    assert spec_to_dict(spec)["lora"]["modules_to_save"] == ["embed_tokens", "lm_head"]
    plain = parse_training_spec({"model": "qwen-1_8b", "method": "lora", "lora": {"rank": 4}})
    assert "modules_to_save" not in spec_to_dict(plain)["lora"]
    with pytest.raises(SpecError) as err:
        parse_training_spec({"model": "qwen-1_8b", "method": "lora", "lora": {"modules_to_save": ["norm"]}})
    assert "lora.modules_to_save[0]" in str(err.value) and "'norm'" in str(err.value)


@pytest.mark.parametrize("kind", ["device", "folder", "huge"])
def test_a_config_path_that_is_no_config_file_is_refused_without_reading_it_all(kind: str, tmp_path: object) -> None:
    """/dev/zero never ends and a folder cannot be read: a config file must be a regular file of at most 4 MiB."""
    from pathlib import Path

    from predictors.catalog import MAX_CONFIG_FILE_BYTES, resolve_model

    folder = Path(str(tmp_path))
    if kind == "device":
        path = Path("/dev/zero")
    elif kind == "folder":
        path = folder
    else:
        path = folder / "config.json"
        path.write_text('{"pad": "' + "x" * MAX_CONFIG_FILE_BYTES + '"}')
    spec = parse_training_spec({"model": {"config_path": str(path)}})
    with pytest.raises(SpecError) as err:
        resolve_model(spec)
    assert "`spec.model.config_path` cannot read" in str(err.value)
    assert ("not a regular file" if kind != "huge" else "larger than 4 MiB") in str(err.value)


@pytest.mark.parametrize(("fields", "path", "fragment"), [
    ({"train_tokens": "1e300"}, "spec.train_tokens", "less than or equal to 1000000000000000"),
    ({"steps": "1e26"}, "spec.steps", "less than or equal to 1000000000"),
    ({"gpus": 10**12}, "spec.gpus", "less than or equal to 1000000"),
    ({"micro_batch_size": "1e21"}, "spec.micro_batch_size", "less than or equal to 1048576"),
    ({"model": {"name": "llama-3.1-8b", "params": "1e300"}}, "spec.model.params", "less than or equal to"),
    ({"steps": 10**9, "grad_accum_steps": 1000}, "spec", "2.05e+15 tokens, beyond 1e+15"),
])
def test_numbers_no_real_job_reaches_are_errors(fields: dict[str, object], path: str, fragment: str) -> None:
    """A typo (1e300 tokens) became a runtime of 10^295 s and a decision the ledger could not store."""
    with pytest.raises(SpecError) as err:
        parse_training_spec({"model": "llama-3.1-8b", **fields})
    problem = err.value.problems[0]
    assert problem.path == path and fragment in problem.message
