"""Cluster simulation: a hand-checked tiny scenario, OOM and retry, oracle, determinism, traces, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scheduler.cli import main
from scheduler.pools import NodePool, PoolsConfig
from scheduler.simulate.engine import DONE, FAILED, simulate
from scheduler.simulate.jobs import JobMix, JobTemplate, draw_template
from scheduler.simulate.policies import POLICY_NAMES, BytesPerParamPolicy, VramfitPolicy, make_policy
from scheduler.simulate.report import summarize
from scheduler.simulate.scenario import TraceJobs, build_from_trace, build_generated
from scheduler.simulate.table import TemplateTable
from scheduler.simulate.traces import default_runs_path, parse_pai_pods, parse_philly
from scheduler.simulate.truth import ErrorModel, Truth

GIB = 2**30


def _pool(name: str, gpu: str, gpus: int, price: float) -> NodePool:
    return NodePool(name=name, gpu=gpu, gpus_per_node=gpus, nodes=1, price_usd_per_gpu_hour=price)


def _table(peak_gib: list[list[float]], spt: list[list[float]], gpus: list[int], ranking: list[tuple[int, ...]],
           pools: tuple[NodePool, ...]) -> TemplateTable:
    peak = np.array(peak_gib) * GIB
    return TemplateTable(
        pools=pools, headroom_fraction=0.05,
        memory_bytes=np.array([p.gpu_spec.memory_bytes for p in pools], dtype=float),
        usable_bytes=np.array([p.usable_bytes(0.05) for p in pools], dtype=float),
        price_usd_per_gpu_hour=np.array([p.price_usd_per_gpu_hour for p in pools]),
        total_gpus=np.array([p.total_gpus for p in pools]), max_job_gpus=np.array([p.max_job_gpus for p in pools]),
        gpus=np.array(gpus), params_total=np.full(len(gpus), 1e9), method=("lora",) * len(gpus),
        sharded=np.zeros(len(gpus), dtype=bool), peak_vram_bytes=peak, peak_vram_upper_bytes=peak * 1.15,
        seconds_per_token=np.array(spt, dtype=float), vramfit_ranking=tuple(ranking))


def _mix(n_templates: int, template_index: list[int], arrivals: list[float], tokens: list[float]) -> JobMix:
    templates = tuple(JobTemplate(draw_template(np.random.default_rng(k), gpus=1).spec) for k in range(n_templates))
    return JobMix(templates, np.array(template_index), np.array(arrivals, dtype=float), np.array(tokens, dtype=float))


TWO_POOLS = (_pool("cheap", "L40S", 2, 1.0), _pool("big", "B200", 2, 4.0))


def test_tiny_scenario_hand_checked() -> None:
    # t0: 1 GPU, fits both (cheap first); t1: 2 GPUs, only the cheap pool listed.
    table = _table([[10, 10], [10, 10]], [[1.0, 0.5], [1.0, 0.5]], [1, 2], [(0, 1), (0,)], TWO_POOLS)
    truth = Truth(table.peak_vram_bytes.copy(), np.ones(2), np.zeros(2))
    # j0 (t1) at 0 takes both cheap GPUs for 1 h; j1 (t0) at 10 s finds cheap full and spills to big
    # (7200 tokens x 0.5 s = 1 h); j2 (t1) at 20 s waits for cheap until j0 ends at 3600 s.
    mix = _mix(2, [1, 0, 1], [0.0, 10.0, 20.0], [3600.0, 7200.0, 3600.0])
    r = simulate(mix, table, truth, VramfitPolicy(table))
    assert r.status.tolist() == [DONE, DONE, DONE]
    assert r.pool.tolist() == [0, 1, 0]
    assert r.start_seconds.tolist() == [0.0, 10.0, 3600.0]
    assert r.finish_seconds.tolist() == [3600.0, 3610.0, 7200.0]
    assert r.wait_seconds.tolist() == [0.0, 0.0, 3580.0]
    assert r.cost_usd.tolist() == pytest.approx([2.0, 4.0, 2.0])  # GPUs x hours x price
    s = summarize(r)
    assert s["cost_usd"] == pytest.approx(8.0)
    assert s["gpu_hours"] == pytest.approx(5.0)
    assert s["oom_failures"] == 0
    assert s["makespan_seconds"] == 7200.0


def test_oom_then_retry_on_bigger_gpu() -> None:
    # predicted 30 GiB fits the L40S (48 GB); the truth is 60 GiB: OOM there, rerun on the B200
    table = _table([[30, 30]], [[1.0, 0.5]], [1], [(0, 1)], TWO_POOLS)
    truth = Truth(table.peak_vram_bytes * 2, np.ones(1), np.zeros(1))
    mix = _mix(1, [0], [0.0], [3600.0])
    r = simulate(mix, table, truth, VramfitPolicy(table), oom_fraction=(0.05, 0.05))
    assert r.status[0] == DONE and r.pool[0] == 1 and r.oom_count[0] == 1
    assert r.wasted_gpu_seconds[0] == pytest.approx(180.0)  # 5 % of 3600 s on 1 GPU
    assert r.finish_seconds[0] == pytest.approx(180.0 + 1800.0)
    assert r.cost_usd[0] == pytest.approx(180 / 3600 * 1.0 + 1800 / 3600 * 4.0)
    assert r.wasted_cost_usd[0] == pytest.approx(0.05)


def test_oom_on_biggest_gpu_fails_for_good() -> None:
    table = _table([[30, 30]], [[1.0, 0.5]], [1], [(1,)], TWO_POOLS)
    truth = Truth(table.peak_vram_bytes * 8, np.ones(1), np.zeros(1))  # 240 GiB: nothing holds it
    r = simulate(_mix(1, [0], [0.0], [3600.0]), table, truth, VramfitPolicy(table))
    assert r.status[0] == FAILED and r.oom_count[0] == 1


def test_bytes_per_param_picks_smallest_gpu_that_holds_the_rule() -> None:
    table = _table([[10, 10]], [[1.0, 1.0]], [1], [(0, 1)], TWO_POOLS)
    policy = BytesPerParamPolicy(table)
    assert policy.estimate_bytes(0) == pytest.approx(2e9)  # LoRA: 2 bytes x 1e9 params
    assert policy.candidates(0) == (0,)
    assert policy.candidates(0, (0,)) == (1,)  # after an OOM: the next bigger GPU type


def _errors() -> ErrorModel:
    logs = np.log(np.array([0.8, 0.95, 1.0, 1.1, 1.3, 1.6]))
    return ErrorModel({"full": logs, "lora": logs, "qlora": logs}, 0.0, 0.27)


POOLS = PoolsConfig(pools=[
    NodePool(name="l40s", gpu="L40S", gpus_per_node=8, nodes=4, price_usd_per_gpu_hour=1.45),
    NodePool(name="a100", gpu="A100-80GB", gpus_per_node=8, nodes=4, price_usd_per_gpu_hour=1.83),
    NodePool(name="b200", gpu="B200", gpus_per_node=8, nodes=2, price_usd_per_gpu_hour=4.99),
])


@pytest.fixture(scope="module")
def small_scenario():  # type: ignore[no-untyped-def]
    return build_generated(400, POOLS, _errors(), seed=3, n_templates=40)


def test_oracle_never_ooms_while_memory_blind_policies_do(small_scenario) -> None:  # type: ignore[no-untyped-def]
    sc = small_scenario
    sums = {name: summarize(simulate(sc.mix, sc.table, sc.truth, make_policy(name, sc.table, sc.truth)))
            for name in POLICY_NAMES}
    assert sums["oracle"]["oom_failures"] == 0
    assert sums["kueue"]["oom_failures"] > 0
    for s in sums.values():
        assert s["completed"] + s["failed_after_oom"] + s["rejected"] == 400


def test_same_seed_same_result_other_seed_differs() -> None:
    def run(seed: int) -> dict[str, object]:
        sc = build_generated(200, POOLS, _errors(), seed=seed, n_templates=20)
        return summarize(simulate(sc.mix, sc.table, sc.truth, make_policy("vramfit", sc.table, sc.truth),
                                  seed=seed))

    assert run(7) == run(7)
    assert run(7)["cost_usd"] != run(8)["cost_usd"]


PHILLY_SAMPLE = """timestamp,duration,num_gpus,gpu_time,cluster
2017-10-09 07:01:55,66.0,1,66.0,11cb48
2017-10-09 06:13:03,2951.0,4,11804.0,6214e9
2017-10-09 06:13:36,2759.0,1,2759.0,6214e9
"""
PAI_SAMPLE = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,\
scheduled_time
openb-pod-0000,12000,16384,1,1000,,LS,Running,0,500,0
openb-pod-0001,6000,12288,0,0,,LS,Running,10,900,10
openb-pod-0002,12000,24576,2,1000,,LS,Running,20,1220,20
"""


def test_trace_readers_on_small_samples() -> None:
    philly = parse_philly(PHILLY_SAMPLE)
    assert philly.gpus.tolist() == [1, 4, 1]
    assert philly.duration_seconds.tolist() == [66.0, 2951.0, 2759.0]
    assert philly.arrival_seconds[0] - philly.arrival_seconds[1] == 48 * 60 + 52
    pai = parse_pai_pods(PAI_SAMPLE)
    assert pai.gpus.tolist() == [1, 2]  # the CPU-only pod is skipped
    assert pai.duration_seconds.tolist() == [500.0, 1200.0]


def test_trace_mix_keeps_arrivals_gpus_and_durations() -> None:
    trace = TraceJobs("sample", np.array([100.0, 40.0, 70.0]), np.array([1, 4, 1]), np.array([600.0, 1200.0, 60.0]))
    sc = build_from_trace(trace, None, POOLS, _errors(), seed=1, templates_per_gpu_count=3)
    assert sc.mix.arrival_seconds.tolist() == [0.0, 30.0, 60.0]
    assert sc.mix.gpus().tolist() == [4, 1, 1]
    # the trace measured how long each job ran: its *true* runtime on the workhorse pool is the trace duration
    assert not np.allclose(sc.truth.runtime_factor, 1.0)  # else true and predicted runtimes would agree
    workhorse = int(np.argmax(sc.table.total_gpus))
    index = sc.mix.template_index
    true = sc.mix.train_tokens * sc.table.seconds_per_token[index, workhorse] * sc.truth.runtime_factor[index]
    assert true.tolist() == pytest.approx([1200.0, 60.0, 600.0])


@pytest.mark.skipif(not default_runs_path().is_file(), reason="shared/reference/runs-dev.jsonl not present")
def test_cli_end_to_end_writes_json_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--jobs", "generate:150", "--templates", "20", "--policy", "vramfit",
                 "--policy", "oracle", "--policy", "biggest", "--out", str(tmp_path), "--no-progress"])
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [p["policy"] for p in summary["policies"]] == ["vramfit", "oracle", "biggest"]
    assert summary["scenario"]["n_jobs"] == 150
    assert set(summary["vramfit_cost_vs"]) == {"oracle", "biggest"}
    for png in ("cost_ooms.png", "wait_cdf.png", "utilisation.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "vramfit cost vs" in capsys.readouterr().out


def test_cli_reports_a_missing_runs_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--jobs", "generate:10", "--runs", str(tmp_path / "none.jsonl")]) == 2
    assert "--runs" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ('{"spec": {"model": "llama-2-7b"}, "arrival_seconds": "x"}', "`line 1: arrival_seconds` must be a finite"),
        ('{"spec": {"model": "llama-2-7b"}, "arrival_seconds": -5}', "from 0 to a century"),
        ('{"spec": {"model": "llama-2-7b"}, "arrival_seconds": Infinity}', "must be a finite number of seconds"),
        ('{"spec": {"model": "llama-2-7b"}, "arival_seconds": 5}', "`line 1: arival_seconds` is not a known field"),
        ("[" * 5000 + "]" * 5000, "`line 1` is not valid JSON: nested too deeply"),
        ('{"arrival_seconds": ' + "9" * 5000 + "}", "`line 1` is not valid JSON: Exceeds the limit (4300 digits)"),
    ],
)
def test_cli_names_a_bad_jobs_line(line: str, fragment: str, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(line + "\n", encoding="utf-8")
    assert main(["simulate", "--jobs", str(jobs), "--policy", "vramfit", "--no-plots", "--no-progress"]) == 2
    assert fragment in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "value"), [("--load", "nan"), ("--load", "inf"), ("--load", "0"),
                                             ("--templates", "0")])
def test_cli_rejects_a_load_or_template_count_that_is_not_positive(flag: str, value: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--jobs", "generate:10", flag, value, "--policy", "vramfit", "--no-plots",
                 "--no-progress"]) == 2
    assert f"`{flag}` must be a positive" in capsys.readouterr().err
