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
        ({"stage": 2, "reduce_bucket_size": "big"}, "zero_optimization.reduce_bucket_size must be a whole number"),
        ({"stage": 2, "reduce_bucket_size": -1}, "from 0 to 1e11"),
        ({"stage": 2, "reduce_bucket_size": 10**400}, "reduce_bucket_size"),  # int() too large for a float
        ({"stage": 2, "reduce_bucket_size": "1e400"}, "reduce_bucket_size"),
        ({"stage": 3, "reduce_bucket_size": 2.5e-3}, "reduce_bucket_size"),
        ({"stage": 2, "reduce_bucket_size": True}, "reduce_bucket_size"),
        ({"stage": 2, "overlap_comm": "maybe"}, "zero_optimization.overlap_comm must be true or false"),
        # DeepSpeed's Optional[bool] refuses these too
        ({"stage": 2, "overlap_comm": "auto"}, "overlap_comm must be true or false; got 'auto'"),
        ({"stage": 2, "overlap_comm": ""}, "overlap_comm must be true or false"),
        ({"stage": 2, "overlap_comm": 2}, "overlap_comm must be true or false; got 2"),
    ],
    ids=["word", "negative", "huge-int", "inf", "fraction", "bool", "overlap-word", "overlap-auto", "overlap-empty",
         "overlap-two"],
)
def test_unusable_values_are_named(zero: dict[str, Any], message: str) -> None:
    [outcome] = scan(*ds_docs(zero))
    assert isinstance(outcome, SpecError)
    assert message in str(outcome)


def test_a_zero_bucket_is_deepspeed_s_and_read() -> None:
    """DeepSpeed takes reduce_bucket_size 0 (every gradient then takes its own path): no buffer."""
    job = ds_job({"stage": 2, "reduce_bucket_size": 0})
    assert job.spec.zero_reduce_bucket_elements == 0


def test_the_stage_that_runs_decides_what_is_read() -> None:
    """The config's own stage is not always the job's: accelerate's --zero_stage fills a config's "auto" stage and
    overrides it, and the annotation may set sharding. The bucket is read where the final stage keeps the buffer;
    elsewhere it is noted, not an error about a field the job never wrote."""
    zero = {"stage": "auto", "reduce_bucket_size": 2e8, "overlap_comm": True}
    config = json.dumps({**BASE, "zero_optimization": zero})
    launch = ["accelerate", "launch", "--use_deepspeed", "--zero_stage"]
    job = one_job(*pytorchjob([*launch, "2", "train.py", "--model_name_or_path", M, "--deepspeed", config],
                              workers=0, gpus=4))
    assert (job.spec.sharding, job.spec.zero_reduce_bucket_elements, job.spec.zero_overlap_comm) == (
        "zero2", 200_000_000, True)
    job = one_job(*pytorchjob([*launch, "1", "train.py", "--model_name_or_path", M, "--deepspeed", config],
                              workers=0, gpus=4))
    assert (job.spec.sharding, job.spec.zero_reduce_bucket_elements, job.spec.zero_overlap_comm) == (
        "zero1", None, None)
    assert any("reduce_bucket_size not read: the job runs zero1" in note for note in job.assumptions)
    # ZeRO-3 keeps one buffer whatever overlap_comm says
    job = one_job(*pytorchjob([*launch, "3", "train.py", "--model_name_or_path", M, "--deepspeed", config],
                              workers=0, gpus=4))
    assert (job.spec.sharding, job.spec.zero_reduce_bucket_elements, job.spec.zero_overlap_comm) == (
        "zero3", 200_000_000, None)
    # the annotation says FSDP: the DeepSpeed config's bucket is left out, with a note
    docs = ds_docs({"stage": 2, "reduce_bucket_size": 2e8})
    docs[-1]["metadata"]["annotations"] = {"vramfit.io/spec": "sharding: fsdp"}
    [outcome] = scan(*docs)
    assert not isinstance(outcome, SpecError), outcome
    assert outcome.spec.sharding == "fsdp" and outcome.spec.zero_reduce_bucket_elements is None
    assert any("reduce_bucket_size not read: the job runs fsdp" in note for note in outcome.assumptions)


def test_stage_one_with_an_offloaded_optimizer_keeps_a_buffer() -> None:
    """DeepSpeed keeps contiguous gradients on at stage 1 when the optimizer is offloaded (overlap stays off)."""
    job = ds_job({"stage": 1, "reduce_bucket_size": 2e8, "overlap_comm": True, "offload_optimizer": {"device": "cpu"}})
    assert (job.spec.sharding, job.spec.offload, job.spec.zero_reduce_bucket_elements, job.spec.zero_overlap_comm) == (
        "zero1", "optimizer", 200_000_000, None)


def test_contiguous_gradients_off_at_stage_three_is_noted_even_offloaded() -> None:
    """Only stages 1-2 turn contiguous gradients back on for an offloaded optimizer; stage 3 keeps it off."""
    job = ds_job({"stage": 3, "contiguous_gradients": False, "offload_optimizer": {"device": "cpu"}})
    assert any("contiguous_gradients false" in note for note in job.assumptions)
