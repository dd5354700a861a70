"""Audit of the cluster simulator: trace parsing of bad rows, trace semantics, hand-checked engine arithmetic,
utilisation of a batch that arrives at once, GPU pins in given specs, tokens of ``steps`` specs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from predictors.errors import SpecError
from predictors.runtime import job_tokens
from predictors.spec import TrainingSpec
from scheduler.cli import main
from scheduler.simulate.engine import DONE, simulate
from scheduler.simulate.policies import POLICY_NAMES, KueuePolicy, VramfitPolicy, make_policy
from scheduler.simulate.report import summarize
from scheduler.simulate.scenario import ScenarioError, TraceJobs, build_from_specs, build_from_trace
from scheduler.simulate.traces import default_runs_path, parse_pai_pods, parse_philly, read_trace
from scheduler.simulate.truth import Truth
from tests.scheduler.test_simulate import POOLS, _errors, _mix, _pool, _table

PHILLY_HEAD = "timestamp,duration,num_gpus,gpu_time,cluster\n"
PAI_HEAD = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
            "scheduled_time\n")
GOOD_PHILLY = "2017-10-09 07:01:55,66.0,1,66.0,c1\n"
GOOD_PAI = "p0,1000,1024,1,1000,,LS,Running,0,500,0\n"
needs_runs = pytest.mark.skipif(not default_runs_path().is_file(), reason="shared/reference/runs-dev.jsonl absent")


# -- trace parsing: every bad row named by file and line, no traceback ---------------------------------------
@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (PHILLY_HEAD + GOOD_PHILLY + "2017-10-09 07:02:55,66.0\n", "`line 3` has 2 fields; the header has 5"),
        (PHILLY_HEAD + GOOD_PHILLY + "2017-10-09 07:02:55,66.0,1,66,c,extra\n", "`line 3` has 6 fields"),
        ("timestamp,duration,gpu_time\n" + "2017-10-09 07:01:55,66.0,66.0\n", "`num_gpus` column is missing"),
        (PHILLY_HEAD + "2017-10-09 07:01:55,inf,1,66.0,c1\n", "`line 2: duration` must be a finite number"),
        (PHILLY_HEAD + "2017-10-09 07:01:55,nan,1,66.0,c1\n", "`line 2: duration` must be a finite number"),
        (PHILLY_HEAD + "2017-10-09 07:01:55,-5,1,66.0,c1\n", "`line 2: duration` must be a finite number of seconds"
                                                             " >= 0; got '-5'"),
        (PHILLY_HEAD + "2017-10-09 07:01:55,5,-1,66.0,c1\n", "`line 2: num_gpus` must be a whole number >= 0"),
        (PHILLY_HEAD + "2017-10-09 07:01:55,5,1.5,66.0,c1\n", "`line 2: num_gpus` must be a whole number >= 0"),
        (PHILLY_HEAD + "9 Oct 2017,5,1,66.0,c1\n", "`line 2: timestamp` must be YYYY-MM-DD HH:MM:SS"),
    ],
)
def test_philly_bad_rows_are_named_by_line(text: str, fragment: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_philly(text, "traces/philly.csv")
    assert fragment in str(info.value)
    assert "traces/philly.csv" in str(info.value)


@pytest.mark.parametrize(
    ("row", "fragment"),
    [
        ("p1,1000,1024,x,1000,,LS,Running,0,500,0\n", "`line 3: num_gpu` must be a whole number >= 0; got 'x'"),
        ("p1,1000,1024,1,1000,,LS,Running,0,,0\n", "`line 3: deletion_time` must be a finite number of seconds"),
        ("p1,1000,1024,1,1000,,LS,Running,900,500,900\n", "`line 3: deletion_time` is before `scheduled_time`"),
        ("p1,1000,1024,1,1000,,LS,Running,900,500,1e400\n", "`line 3: scheduled_time` must be a finite number"),
    ],
)
def test_pai_bad_rows_are_named_by_line(row: str, fragment: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_pai_pods(PAI_HEAD + GOOD_PAI + row, "pods.csv")
    assert fragment in str(info.value) and "pods.csv" in str(info.value)


def test_pai_skips_pods_that_never_ran_and_times_runs_from_scheduling() -> None:
    # p1 waited 40 s before it was scheduled: its run is 1,200 s, not the 1,240 s of its lifetime; p2 was
    # deleted while Pending (no scheduled_time): it never ran and is no job; p3 has no GPU.
    text = PAI_HEAD + GOOD_PAI + ("p1,1000,1024,2,1000,,LS,Running,20,1260,60\n"
                                  "p2,1000,1024,1,500,,BE,Pending,30,130,\n"
                                  "p3,1000,1024,0,0,,LS,Running,40,900,40\n")
    pai = parse_pai_pods(text)
    assert pai.arrival_seconds.tolist() == [0.0, 20.0]
    assert pai.gpus.tolist() == [1, 2]
    assert pai.duration_seconds.tolist() == [500.0, 1200.0]
    assert any("1 pod(s) never scheduled" in note for note in pai.notes)


def test_trace_byte_order_mark_is_read() -> None:
    assert parse_philly("\ufeff" + PHILLY_HEAD + GOOD_PHILLY).gpus.tolist() == [1]


def test_read_trace_names_an_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "philly_pollux_subset" / "philly.csv"
    path.parent.mkdir()
    path.write_text(PHILLY_HEAD, encoding="utf-8")
    with pytest.raises(SpecError) as info:
        read_trace("philly", tmp_path)
    assert "holds no GPU jobs" in str(info.value) and str(path) in str(info.value)


def test_trace_whose_jobs_all_exceed_the_pools_is_an_error_not_a_crash() -> None:
    trace = TraceJobs("sample", np.array([0.0, 5.0]), np.array([64, 128]), np.array([60.0, 60.0]))
    with pytest.raises(ScenarioError, match="none of the 2 trace jobs can run: 2 ask for more GPUs"):
        build_from_trace(trace, None, POOLS, _errors(), seed=1)


@needs_runs
def test_cli_names_a_trace_row_it_cannot_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "philly_pollux_subset" / "philly.csv"
    path.parent.mkdir()
    path.write_text(PHILLY_HEAD + GOOD_PHILLY + "2017-10-09 07:02:55,66.0\n", encoding="utf-8")
    assert main(["simulate", "--jobs", "philly", "--traces-dir", str(tmp_path), "--policy", "vramfit",
                 "--no-plots", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"invalid input in {path}: `line 3` has 2 fields" in err


# -- the engine's arithmetic, checked by hand -------------------------------------------------------------------
ONE_POOL = (_pool("only", "L40S", 4, 1.0),)


def test_simultaneous_ends_free_a_blocked_head_and_there_is_no_backfill() -> None:
    # t0 = 2 GPUs, t1 = 4 GPUs, t2 = 1 GPU; 1 s per token on the single 4-GPU pool.
    table = _table([[10], [10], [10]], [[1.0], [1.0], [1.0]], [2, 4, 1], [(0,), (0,), (0,)], ONE_POOL)
    truth = Truth(table.peak_vram_bytes.copy(), np.ones(3), np.zeros(3))
    # j0, j1 (2 GPUs each) run 0-100 s and end together; j2 (4 GPUs, at 10 s) waits for both and starts at
    # 100 s; j3 (1 GPU, at 20 s) queues behind j2 (no backfill: at 100 s, with j2 started, nothing is free) and
    # starts at j2's end, 200 s; j4 (2 GPUs) arrives at 100 s, the instant j0/j1 end: the ends go first, j2
    # takes the GPUs, j3 is queued ahead of j4, so j4 queues too and starts with j3 at 200 s.
    mix = _mix(3, [0, 0, 1, 2, 0], [0.0, 0.0, 10.0, 20.0, 100.0], [100.0, 100.0, 100.0, 50.0, 30.0])
    r = simulate(mix, table, truth, VramfitPolicy(table))
    assert r.status.tolist() == [DONE] * 5
    assert r.start_seconds.tolist() == [0.0, 0.0, 100.0, 200.0, 200.0]
    assert r.finish_seconds.tolist() == [100.0, 100.0, 200.0, 250.0, 230.0]
    assert r.wait_seconds.tolist() == [0.0, 0.0, 90.0, 180.0, 100.0]
    assert r.gpu_seconds.tolist() == [200.0, 200.0, 400.0, 50.0, 60.0]
    s = summarize(r)
    assert s["gpu_hours"] == pytest.approx(910 / 3600)
    assert s["cost_usd"] == pytest.approx(910 / 3600 * 1.0)
    # busy GPU-seconds between the first (0 s) and last (100 s) arrival: 4 GPUs x 100 s of 4 GPUs x 100 s
    assert s["utilisation_by_pool"]["only"] == pytest.approx(1.0)


def test_an_end_at_an_arrival_time_is_seen_by_the_arrival() -> None:
    table = _table([[10]], [[1.0]], [4], [(0,)], ONE_POOL)
    truth = Truth(table.peak_vram_bytes.copy(), np.ones(1), np.zeros(1))
    r = simulate(_mix(1, [0, 0], [0.0, 100.0], [100.0, 100.0]), table, truth, VramfitPolicy(table))
    assert r.start_seconds.tolist() == [0.0, 100.0] and r.wait_seconds.tolist() == [0.0, 0.0]


def test_kueue_waits_on_every_pool_and_the_first_to_free_wins() -> None:
    pools = (_pool("a", "L40S", 2, 1.0), _pool("b", "A100-80GB", 2, 2.0))
    table = _table([[10, 10]], [[1.0, 1.0]], [2], [(0, 1)], pools)
    truth = Truth(table.peak_vram_bytes.copy(), np.ones(1), np.zeros(1))
    # j0 holds a for 300 s, j1 holds b for 100 s; j2 waits on both and takes b at 100 s; j3 queued behind
    # j2 on both: its stale predecessor on a is skipped, it takes b at 200 s (a is busy until 300 s).
    mix = _mix(1, [0, 0, 0, 0], [0.0, 0.0, 10.0, 20.0], [300.0, 100.0, 100.0, 100.0])
    r = simulate(mix, table, truth, KueuePolicy(table))
    assert r.pool.tolist() == [0, 1, 1, 1]
    assert r.start_seconds.tolist() == [0.0, 0.0, 100.0, 200.0]
    assert r.cost_usd.tolist() == pytest.approx([2 * 300 / 3600, 4 * 100 / 3600, 4 * 100 / 3600, 4 * 100 / 3600])


def test_the_seed_moves_only_the_oom_times() -> None:
    table = _table([[30, 30]], [[1.0, 0.5]], [1], [(0, 1)], (_pool("cheap", "L40S", 2, 1.0),
                                                            _pool("big", "B200", 2, 4.0)))
    truth = Truth(table.peak_vram_bytes * 2, np.ones(1), np.zeros(1))  # OOM on the L40S, fits the B200
    mix = _mix(1, [0, 0], [0.0, 0.0], [3600.0, 3600.0])
    a, b, c = (simulate(mix, table, truth, VramfitPolicy(table), seed=s) for s in (1, 1, 2))
    assert a.wasted_gpu_seconds.tolist() == b.wasted_gpu_seconds.tolist()
    assert a.wasted_gpu_seconds.tolist() != c.wasted_gpu_seconds.tolist()
    for r in (a, c):
        assert np.all((r.wasted_gpu_seconds >= 0.02 * 3600) & (r.wasted_gpu_seconds <= 0.10 * 3600))
        assert r.gpu_seconds - r.wasted_gpu_seconds == pytest.approx([1800.0, 1800.0])


# -- report: utilisation of a batch that arrives at once --------------------------------------------------------
def test_utilisation_of_a_batch_submitted_at_one_instant_is_over_the_makespan() -> None:
    table = _table([[10]], [[1.0]], [2], [(0,)], ONE_POOL)
    truth = Truth(table.peak_vram_bytes.copy(), np.ones(1), np.zeros(1))
    # both jobs at 0 s: 2 + 2 GPUs for 100 s and 300 s on 4 GPUs over a 300 s makespan = 800 / 1200
    r = simulate(_mix(1, [0, 0], [0.0, 0.0], [100.0, 300.0]), table, truth, VramfitPolicy(table))
    s = summarize(r)
    assert s["utilisation_by_pool"]["only"] == pytest.approx(800 / 1200)
    assert s["utilisation_window_seconds"] == pytest.approx(300.0)


# -- given specs ------------------------------------------------------------------------------------------------
def test_a_gpu_pin_in_a_given_spec_binds_every_policy() -> None:
    pinned = TrainingSpec(model="qwen2.5-0.5b", method="lora", gpus=1, train_tokens=1e7, gpu="L40S")
    free = pinned.model_copy(update={"gpu": None})
    sc = build_from_specs([pinned, free], [0.0, 0.0], POOLS, _errors(), seed=0)
    l40s = sc.table.pool_index("l40s")
    t_pinned = int(sc.mix.template_index[0])
    for name in POLICY_NAMES:
        policy = make_policy(name, sc.table, sc.truth)
        assert set(policy.candidates(t_pinned)) <= {l40s}, name
        r = simulate(sc.mix, sc.table, sc.truth, policy)
        assert r.pool[0] == l40s or r.status[0] != DONE, name


def test_tokens_of_a_steps_spec_are_the_runtime_models() -> None:
    spec = TrainingSpec(model="qwen2.5-0.5b", method="full", gpus=4, pipeline_parallel=4, steps=100,
                        micro_batch_size=2, seq_len=512)
    sc = build_from_specs([spec], [0.0], POOLS, _errors(), seed=0)
    assert sc.mix.train_tokens.tolist() == [job_tokens(spec)]
    assert job_tokens(spec) == 100 * 2 * 512 * 4  # 4 micro-batches in flight in a 4-stage pipeline, 1 replica
