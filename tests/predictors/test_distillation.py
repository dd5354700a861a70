"""Knowledge distillation (``teacher_model``): a frozen teacher beside the student, its forward per micro-batch, and
the distillation loss's saved tensors; checked by hand on the tiny model of test_vram.py."""

from __future__ import annotations

from typing import Any

import pytest

from predictors.architecture import architecture_from_config
from predictors.catalog import resolve_model
from predictors.errors import SpecError
from predictors.hardware import lookup_gpu
from predictors.predict import predict
from predictors.runtime import predict_runtime
from predictors.spec import TrainingSpec, parse_training_spec
from predictors.vram import predict_vram
from tests.predictors.test_vram import ARCH, TINY, V

TEACHER_CONFIG = {**TINY, "num_hidden_layers": 4, "intermediate_size": 256}
TEACHER = architecture_from_config(TEACHER_CONFIG, "tiny-teacher")


def _spec(**fields: Any) -> TrainingSpec:
    return parse_training_spec({"model": {"name": "tiny", "config": TINY},
                                "teacher_model": {"name": "tiny-teacher", "config": TEACHER_CONFIG},
                                "precision": "bf16-true", "micro_batch_size": 2, "seq_len": 64, **fields})


def test_teacher_weights_forward_and_loss_by_hand() -> None:
    spec = _spec()
    with_teacher = predict_vram(spec, ARCH, lookup_gpu("A100-80GB"), teacher=TEACHER)
    alone = predict_vram(spec.model_copy(update={"teacher_model": None}), ARCH, lookup_gpu("A100-80GB"))
    b = with_teacher.breakdown_bytes
    tokens = 2 * 64
    assert b["teacher_weights"] == TEACHER.params_total * 2  # bf16, not sharded on one GPU
    # the teacher's bf16 logits and its widest no_grad intermediate (gate, up and their product: 3 x its MLP width)
    assert b["teacher_forward"] == tokens * V * 2 + tokens * 256 * 3 * 2
    # ForwardKLLoss keeps fp32 teacher probabilities, fp32 student log-probabilities and the -inf mask per logit
    assert b["distillation_loss"] == tokens * V * 9
    assert with_teacher.peak_phase == "backward"
    extra = b["teacher_weights"] + b["teacher_forward"] + b["distillation_loss"]
    assert with_teacher.peak_allocated_bytes == alone.peak_allocated_bytes + extra
    assert any("teacher_model tiny-teacher" in n for n in with_teacher.notes)


def test_sharding_shards_the_teacher_as_it_shards_the_model() -> None:
    spec = _spec(gpus=4, sharding="fsdp")
    b = predict_vram(spec, ARCH, None, teacher=TEACHER).breakdown_bytes
    assert b["teacher_weights"] == pytest.approx(TEACHER.params_total * 2 / 4, abs=1)
    zero2 = predict_vram(_spec(gpus=4, sharding="zero2"), ARCH, None, teacher=TEACHER).breakdown_bytes
    assert zero2["teacher_weights"] == TEACHER.params_total * 2  # ZeRO-2 keeps whole weights


def test_a_teacher_is_required_when_the_spec_names_one() -> None:
    with pytest.raises(ValueError, match="teacher_model needs its architecture"):
        predict_vram(_spec(), ARCH, None)


def test_teacher_errors_name_the_teacher_field() -> None:
    with pytest.raises(SpecError) as err:
        resolve_model(TrainingSpec.model_validate({"model": "llama-3.2-1b", "teacher_model": "llama-9-8b"}))
    assert "`spec.teacher_model` unknown model 'llama-9-8b'" in str(err.value)
    with pytest.raises(SpecError) as err:
        resolve_model(TrainingSpec.model_validate({"model": "llama-3.2-1b",
                                                   "teacher_model": {"config": {**TINY, "hidden_size": -1}}}))
    assert "teacher_model.config.hidden_size" in str(err.value)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"pipeline_parallel": 2, "gpus": 2}, "teacher_model with pipeline_parallel > 1"),
        ({"task": "seq-classification"}, "classifier head"),
        ({"teacher_model": ""}, "must name a model"),
    ],
    ids=["pipeline", "classifier", "empty"],
)
def test_bad_teacher_specs_are_named(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_training_spec({"model": "llama-3.2-1b", "teacher_model": "llama-3.1-8b", **fields})
    assert message in str(err.value)


def test_predict_resolves_the_teacher_and_the_runtime_pays_its_forward() -> None:
    spec = TrainingSpec.model_validate({"model": "llama-3.2-1b", "teacher_model": "meta-llama/Llama-3.1-8B",
                                        "method": "lora", "precision": "bf16-true", "micro_batch_size": 4,
                                        "seq_len": 1024, "train_tokens": 1e8})
    with_teacher = predict(spec, gpu_name="A100-80GB")
    alone = predict(spec.model_copy(update={"teacher_model": None}), gpu_name="A100-80GB")
    # Llama-3.1-8B's bf16 weights
    assert with_teacher.vram.breakdown_bytes["teacher_weights"] == 8_030_261_248 * 2
    assert with_teacher.peak_vram_upper_bytes > alone.peak_vram_upper_bytes + 16e9
    resolved = resolve_model(spec)
    assert resolved.teacher is not None and resolved.teacher.label == "llama-3.1-8b"
    runtime = predict_runtime(spec, resolved.architecture, lookup_gpu("A100-80GB"),
                              teacher=resolved.teacher_architecture)
    bare = predict_runtime(spec.model_copy(update={"teacher_model": None}), resolved.architecture,
                           lookup_gpu("A100-80GB"))
    forward = runtime.components_seconds["teacher_forward"]
    # an 8B forward (2 FLOPs per parameter and token) costs more than the 1B student's forward and backward
    assert forward > bare.components_seconds["compute"]
    assert runtime.step_time_seconds == pytest.approx(bare.step_time_seconds + forward, rel=0.05)
    parts, _ = runtime.step_breakdown()
    assert parts["teacher_forward"] == forward
    assert with_teacher.runtime_seconds is not None and alone.runtime_seconds is not None
    assert with_teacher.runtime_seconds > 2 * alone.runtime_seconds
