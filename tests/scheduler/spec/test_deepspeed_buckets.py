"""A DeepSpeed config's gradient bucket: ``zero_optimization.reduce_bucket_size`` and ZeRO-2's ``overlap_comm`` are
read into ``zero_reduce_bucket_elements`` / ``zero_overlap_comm``; stage 1 ignores both, as DeepSpeed does; a value
DeepSpeed could not use is an error naming the key."""

from __future__ import annotations

import json
from typing import Any

import pytest

from predictors.errors import SpecError
from tests.scheduler.spec.helpers import one_job, scan
from tests.scheduler.spec.test_hybrid_sharding import M, pytorchjob

BASE = {"bf16": {"enabled": True}, "train_micro_batch_size_per_gpu": 1}


def ds_docs(zero: dict[str, Any]) -> list[Any]:
    config = {**BASE, "zero_optimization": zero}
    return pytorchjob(["deepspeed", "train.py", "--model_name_or_path", M, "--deepspeed", json.dumps(config)],
                      workers=0, gpus=4)


def ds_job(zero: dict[str, Any]) -> Any:
    return one_job(*ds_docs(zero))


def test_bucket_and_overlap_are_read_at_stage_two() -> None:
    job = ds_job({"stage": 2, "reduce_bucket_size": 2e8, "overlap_comm": True, "contiguous_gradients": True})
    assert (job.spec.sharding, job.spec.zero_reduce_bucket_elements, job.spec.zero_overlap_comm) == (
        "zero2", 200_000_000, True)
    assert "zero_optimization" in job.provenance["zero_reduce_bucket_elements"]
    job = ds_job({"stage": 2, "reduce_bucket_size": "5e8", "overlap_comm": "false"})
    assert (job.spec.zero_reduce_bucket_elements, job.spec.zero_overlap_comm) == (500_000_000, False)


def test_auto_and_stage_three() -> None:
    job = ds_job({"stage": 3, "reduce_bucket_size": "auto", "overlap_comm": True})
    assert job.spec.zero_reduce_bucket_elements == "auto"
    # ZeRO-3 keeps one flat buffer whatever overlap_comm says: not read
    assert job.spec.zero_overlap_comm is None


def test_stage_one_and_an_unset_bucket() -> None:
    job = ds_job({"stage": 1, "reduce_bucket_size": 2e8, "overlap_comm": True})
    assert (job.spec.sharding, job.spec.zero_reduce_bucket_elements, job.spec.zero_overlap_comm) == (
        "zero1", None, None)
    job = ds_job({"stage": 2})
    assert (job.spec.zero_reduce_bucket_elements, job.spec.zero_overlap_comm) == (None, None)


def test_contiguous_gradients_off_is_noted() -> None:
    job = ds_job({"stage": 2, "contiguous_gradients": False})
    assert any("contiguous_gradients false" in note for note in job.assumptions)
    # CPU offload of the optimizer turns it back on: nothing to note
    job = ds_job({"stage": 2, "contiguous_gradients": False, "offload_optimizer": {"device": "cpu"}})
    assert not any("contiguous_gradients false" in note for note in job.assumptions)


@pytest.mark.parametrize(
    ("zero", "message"),
    [
        ({"stage": 2, "reduce_bucket_size": "big"}, "zero_optimization.reduce_bucket_size must be a positive number"),
        ({"stage": 2, "reduce_bucket_size": 0}, "got 0"),
        ({"stage": 3, "reduce_bucket_size": 2.5e-3}, "reduce_bucket_size"),
        ({"stage": 2, "reduce_bucket_size": True}, "reduce_bucket_size"),
        ({"stage": 2, "overlap_comm": "maybe"}, "zero_optimization.overlap_comm must be true or false"),
    ],
    ids=["word", "zero", "fraction", "bool", "overlap-word"],
)
def test_unusable_values_are_named(zero: dict[str, Any], message: str) -> None:
    [outcome] = scan(*ds_docs(zero))
    assert isinstance(outcome, SpecError)
    assert message in str(outcome)
