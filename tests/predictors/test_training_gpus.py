"""``training_gpus``: a job that trains its model on some of its GPUs and runs other roles on the rest (OpenRLHF's
actor beside vLLM engines and reference / reward / critic models placed apart). The model's sharding, batch and
throughput are those of the training GPUs; the job still holds all of them."""

from __future__ import annotations

import pytest

from predictors.catalog import resolve_model
from predictors.errors import SpecError
from predictors.hardware import lookup_gpu
from predictors.runtime import job_tokens, predict_runtime
from predictors.spec import parse_training_spec
from tests.predictors.test_vram import PARAMS, run


def test_states_shard_over_the_training_gpus_only() -> None:
    """ZeRO-3 on 2 of 8 GPUs holds what ZeRO-3 on a 2-GPU job holds: bf16-true weights 2 and AdamW states 4 bytes per
    parameter, over 2 ranks (not 8); the prediction still names the job's 8 GPUs."""
    part = run(precision="bf16-true", gpus=8, training_gpus=2, sharding="zero3")
    alone = run(precision="bf16-true", gpus=2, sharding="zero3")
    assert part.breakdown_bytes["weights"] == pytest.approx(PARAMS * 2 / 2, abs=1)
    assert part.breakdown_bytes["optimizer_states"] == pytest.approx(PARAMS * 4 / 2, abs=1)
    assert part.peak_allocated_bytes == alone.peak_allocated_bytes
    assert part.gpus == 8
    assert any("trains on 2 of the job's 8 GPUs" in n for n in part.notes)
    # one training GPU is not data parallel at all
    single = parse_training_spec({"model": "llama-3.2-1b", "gpus": 4, "training_gpus": 1})
    assert (single.data_parallel(), single.resolved_sharding()) == (1, "none")


def test_throughput_and_tokens_are_the_training_gpus() -> None:
    """The job's tokens per step (steps x micro-batch x length x data-parallel ranks) and its throughput are those
    of the training GPUs: 2 of 8 train a quarter of the tokens per step of 8, at about a quarter of the rate."""
    fields = {"model": "llama-3.2-1b", "precision": "bf16-mixed", "sharding": "zero2", "gpus": 8, "steps": 100,
              "micro_batch_size": 4, "seq_len": 1024}
    part, whole = parse_training_spec({**fields, "training_gpus": 2}), parse_training_spec(fields)
    assert job_tokens(part) == job_tokens(whole) / 4 == 100 * 4 * 1024 * 2
    arch = resolve_model(part).architecture
    gpu = lookup_gpu("H100-80GB")
    two = predict_runtime(part, arch, gpu)
    eight = predict_runtime(whole, arch, gpu)
    assert two.tokens_per_step == eight.tokens_per_step / 4
    assert two.tokens_per_second == pytest.approx(eight.tokens_per_second / 4, rel=0.15)


@pytest.mark.parametrize(("fields", "message"), [
    ({"gpus": "auto", "training_gpus": 2}, "training_gpus is the part of a fixed GPU count"),
    ({"gpus": 2, "training_gpus": 4}, "training_gpus (4) is more than the job's gpus (2)"),
    ({"gpus": 8, "training_gpus": 3, "tensor_parallel": 2}, "training_gpus (3) must be a multiple of"),
    ({"gpus": 8, "training_gpus": 0}, "training_gpus"),
])
def test_bad_training_gpus_are_named(fields: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_training_spec({"model": "llama-3.2-1b", **fields})
    assert message in str(caught.value)


def test_a_gpu_count_below_the_training_gpus_is_refused() -> None:
    """predict for fewer GPUs than train (`vramfit predict --gpus 1` on a spec with training_gpus 2): refused."""
    from predictors.vram import predict_vram

    spec = parse_training_spec({"model": "llama-3.2-1b", "gpus": 8, "training_gpus": 2})
    with pytest.raises(SpecError, match="fewer than training_gpus"):
        predict_vram(spec, resolve_model(spec).architecture, gpus=1)


def test_model_parallel_applies_to_the_training_gpus() -> None:
    """7 GPUs in the job (4 training with tensor parallel 2, 3 for engines) is a valid layout."""
    spec = parse_training_spec({"model": "llama-3.2-1b", "gpus": 7, "training_gpus": 4, "tensor_parallel": 2})
    assert spec.data_parallel() == 2
