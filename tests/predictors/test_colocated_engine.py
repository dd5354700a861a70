"""A colocated inference engine (vLLM in TRL's GRPO ``vllm_mode colocate``) holds a set share of every training GPU's
memory: counted exactly, on each GPU by its own memory, in every level and in the bound without the bound's margin."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from predictors.catalog import resolve_model
from predictors.hardware import lookup_gpu
from predictors.predict import SpecPredictor, predict
from predictors.spec import TrainingSpec
from scheduler.placement import place
from scheduler.pools import default_pools

BASE = {"model": "qwen2.5-1.5b", "method": "full", "micro_batch_size": 16, "seq_len": 1536,
        "gradient_checkpointing": "full", "gpus": 8, "sharding": "zero2"}


def _spec(**extra: object) -> TrainingSpec:
    return TrainingSpec.model_validate({**BASE, **extra})


@pytest.mark.parametrize("gpu", ["A100-80GB", "H100-80GB", "B200", "L40S"])
@pytest.mark.parametrize("residual", [True, False])
def test_the_engine_adds_its_share_of_each_gpu_to_every_level_and_the_bound(gpu: str, residual: bool) -> None:
    without = predict(_spec(), gpu, residual=residual)
    with_engine = predict(_spec(colocated_engine_memory_fraction=0.3), gpu, residual=residual)
    engine = round(0.3 * lookup_gpu(gpu).memory_bytes)
    assert with_engine.vram.breakdown_bytes["colocated_engine"] == engine
    for level in ("peak_allocated_bytes", "peak_reserved_bytes", "peak_vram_bytes"):
        assert getattr(with_engine.vram, level) - getattr(without.vram, level) == engine
    # a setting, not a prediction: the bound's margin does not scale it
    assert with_engine.peak_vram_upper_bytes - without.peak_vram_upper_bytes == engine
    assert any("colocated inference engine" in n for n in with_engine.vram.notes)
    # the breakdown still adds up to the levels
    assert with_engine.to_dict()["breakdown_bytes"]["colocated_engine"] == engine


def test_without_a_gpu_the_share_is_named_not_counted() -> None:
    pred = predict(_spec(colocated_engine_memory_fraction=0.3))
    assert "colocated_engine" not in pred.vram.breakdown_bytes
    assert any("counted once the GPU is known" in n for n in pred.vram.notes)


def test_floors_stay_under_the_bound_with_the_engine() -> None:
    spec = _spec(colocated_engine_memory_fraction=0.45)
    model = resolve_model(spec)
    for gpu in ("L40S", "A100-80GB", "B200"):
        for n in (1, 8):
            floor = SpecPredictor(spec, model).upper_floor_bytes(gpu, n)
            required = SpecPredictor(spec, model).required_floor_bytes(gpu, n)
            memory = SpecPredictor(spec, model).memory_many([(gpu, n)])[0]
            assert required <= memory.required_bytes and floor <= memory.peak_vram_upper_bytes


def test_placement_leaves_the_engine_its_share() -> None:
    """The training step alone fits an L40S (48 GB); with 30 % of each GPU's memory held by vLLM it needs an
    A100-80GB."""
    alone = place(_spec(), default_pools(), suggest=False)
    shared = place(_spec(colocated_engine_memory_fraction=0.3), default_pools(), suggest=False)
    assert alone.chosen is not None and alone.chosen.pool.gpu == "L40S"
    assert shared.chosen is not None and shared.chosen.pool.gpu == "A100-80GB"
    l40s = next(o for o in shared.alternatives if o.pool.gpu == "L40S")
    assert not l40s.fits


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.2, "most"])
def test_the_share_must_be_a_fraction(bad: object) -> None:
    with pytest.raises(ValidationError, match="colocated_engine_memory_fraction"):
        _spec(colocated_engine_memory_fraction=bad)
    from predictors.errors import SpecError
    from predictors.spec import parse_training_spec

    with pytest.raises(SpecError) as info:  # the message a user reads: a share, never "a positive integer"
        parse_training_spec({**BASE, "colocated_engine_memory_fraction": bad})
    assert "positive integer" not in str(info.value) and "null when no engine" in str(info.value)


def test_the_residual_learns_the_training_step_without_the_engine() -> None:
    """Training took the analytic case with the engine in it while serving corrects the case without it and adds the
    engine after: a run with an engine is now learned as its measured peak less the engine's share, against the
    analytic case without it, as serving sees it."""
    from predictors.reference import ReferenceRun
    from predictors.training import case_for_run, training_rows

    spec = {**BASE, "colocated_engine_memory_fraction": 0.3}
    run = ReferenceRun.model_validate({"id": "grpo-1", "source_id": "s", "quality": "high", "spec": spec,
                                       "gpu": "H100-80GB", "measured": {"peak_bytes": 60 * 2**30, "metric": "nvml"}})
    _, served = SpecPredictor(run.spec, resolve_model(run.spec)).analytic("H100-80GB", None)
    assert case_for_run(run).vram.peak_vram_bytes == served.peak_vram_bytes
    (row,), _ = training_rows([run])
    assert row.measured_bytes == 60 * 2**30 - round(0.3 * lookup_gpu("H100-80GB").memory_bytes)
