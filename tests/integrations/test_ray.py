"""The Ray adapter against a real local multi-node Ray cluster on 127.0.0.1.

The cluster: a head without GPUs (it runs the dashboard and job server), a node with 4 logical GPUs
declared as ``accelerator_type:L40S`` (resource only, no label), a node with 8 declared as
``accelerator_type:H100`` plus the ``ray.io/accelerator-type`` label, and a node with 1 typed only by the
label ``ray.io/accelerator-type=A100`` (no ``accelerator_type:A100`` resource; ``POOLS`` does not price A100,
so the other tests do not see it as a pool). Jobs are placed, submitted through the Ray Jobs API, and report
where they ran.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# Every Ray process of the test cluster must use the loopback address. On Linux, Ray swaps 127.0.0.1 for
# the machine's outward address unless it runs in its single-machine mode, which this variable selects;
# set before Ray is imported (child processes read it from the environment).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
ray = pytest.importorskip("ray")
pytest.importorskip("ray.job_submission")

from ray.cluster_utils import Cluster  # noqa: E402

from scheduler.cli import main  # noqa: E402
from scheduler.integrations.ray import JobRefused, discover_pools, plan_submission, submit_job  # noqa: E402
from scheduler.integrations.ray.submit import job_client  # noqa: E402
from scheduler.integrations.ray.train import scaling_config_kwargs  # noqa: E402
from scheduler.placement import place  # noqa: E402
from scheduler.pools import parse_pools  # noqa: E402
from scheduler.spec import read_jobs  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.integration]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LOOPBACK = "127.0.0.1"
SMALL_STORE_BYTES = 80 * 1024 * 1024
JOB_TIMEOUT_SECONDS = 90.0
POOLS = parse_pools({"pools": [
    {"name": "l40s", "gpu": "L40S", "gpus_per_node": 8, "nodes": 2, "price_usd_per_gpu_hour": 1.45},
    {"name": "h100", "gpu": "H100", "gpus_per_node": 8, "nodes": 2, "price_usd_per_gpu_hour": 2.99},
]})

# The job's entrypoint: where the driver is, what vramfit told it, and where GPU tasks shaped by that land.
PROBE = """
import json, os, ray
ray.init()
kind = os.environ["VRAMFIT_ACCELERATOR_TYPE"]
gpus = int(os.environ["VRAMFIT_NUM_GPUS"])

@ray.remote(num_gpus=1, accelerator_type=kind)
def where():
    # the resources the task holds: accelerator_type:<TYPE> exists only on the node of that type
    return ray.get_runtime_context().get_node_id(), sorted(ray.get_runtime_context().get_assigned_resources())

report = {
    "env": {k: v for k, v in os.environ.items() if k.startswith("VRAMFIT_")},
    "tasks": ray.get([where.remote() for _ in range(gpus)]),
    "cluster_resources": ray.cluster_resources(),
}
print("VRAMFIT_PROBE " + json.dumps(report))
"""

# The same for a pool typed only by the ray.io/accelerator-type label: the node the driver runs on, that node's
# labels, and where GPU tasks land when steered as scaling_config_from_env steers Ray Train workers
# (accelerator_type=<TYPE> would ask for an accelerator_type:<TYPE> resource such a node does not have).
# The driver's node is the one whose raylet started it (raylet -> job supervisor actor -> entrypoint): on this
# one-host cluster the driver's ray.init() attaches to the head's raylet whatever node started it (Ray prefers
# the head when several nodes share a host: ray._private.services.get_node_to_connect_for_driver), so
# get_node_id() in the driver would name the head.
LABEL_PROBE = """
import json, os, psutil, ray
raylet = next(p for p in psutil.Process().parents() if any(a.startswith("--node_id=") for a in p.cmdline()))
node_id = next(a for a in raylet.cmdline() if a.startswith("--node_id=")).removeprefix("--node_id=")
ray.init()
from scheduler.integrations.ray.train import scaling_config_kwargs_from_env
scaling = scaling_config_kwargs_from_env()  # what a TorchTrainer's workers would be given
steer = {k: scaling[k] for k in ("label_selector", "accelerator_type") if k in scaling}

@ray.remote(num_gpus=1, **steer)
def where():
    return ray.get_runtime_context().get_node_id()

report = {
    "env": {k: v for k, v in os.environ.items() if k.startswith("VRAMFIT_")},
    "scaling": scaling,
    "driver_node": node_id,
    "driver_labels": next(n["Labels"] for n in ray.nodes() if n["NodeID"] == node_id),
    "tasks": ray.get([where.remote() for _ in range(scaling["num_workers"])], timeout=60),
}
print("VRAMFIT_PROBE " + json.dumps(report))
"""
A100_POOL = {"name": "a100", "gpu": "A100-80GB", "gpus_per_node": 8, "nodes": 1, "price_usd_per_gpu_hour": 1.2}


@dataclass
class LocalCluster:
    cluster: Any
    gcs_address: str
    dashboard: str
    l40s_node: str
    h100_node: str
    a100_node: str  # typed only by the ray.io/accelerator-type label
    probe: Path
    label_probe: Path

    def entrypoint(self, probe: Path | None = None) -> str:
        return f"{shlex.quote(sys.executable)} {shlex.quote(str(probe or self.probe))}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    from ray._private import ray_constants

    # In case Ray was imported before this module set the variable (the in-process half of the same switch).
    ray_constants.ENABLE_RAY_CLUSTER = False
    port = _free_port()
    common = {"node_ip_address": LOOPBACK, "object_store_memory": SMALL_STORE_BYTES}
    cluster = Cluster(initialize_head=True, head_node_args={
        **common, "num_cpus": 1, "num_gpus": 0, "include_dashboard": True, "dashboard_host": LOOPBACK,
        "dashboard_port": port})
    try:
        l40s = cluster.add_node(**common, num_cpus=1, num_gpus=4, resources={"accelerator_type:L40S": 4})
        h100 = cluster.add_node(**common, num_cpus=2, num_gpus=8, resources={"accelerator_type:H100": 8},
                                labels={"ray.io/accelerator-type": "H100"})
        a100 = cluster.add_node(**common, num_cpus=1, num_gpus=1, labels={"ray.io/accelerator-type": "A100"})
        cluster.wait_for_nodes(timeout=60)
        dashboard = f"http://{LOOPBACK}:{port}"
        deadline = time.monotonic() + 60
        while True:  # the job server answers a little after the head is up
            try:
                job_client(dashboard, timeout_seconds=10)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        probes = tmp_path_factory.mktemp("ray-job")
        probe, label_probe = probes / "probe.py", probes / "label_probe.py"
        probe.write_text(PROBE, encoding="utf-8")
        label_probe.write_text(LABEL_PROBE, encoding="utf-8")
        yield LocalCluster(cluster, cluster.address, dashboard, l40s.node_id, h100.node_id, a100.node_id, probe,
                           label_probe)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


def _wait(client: Any, submission_id: str) -> Any:
    deadline = time.monotonic() + JOB_TIMEOUT_SECONDS
    while True:
        info = client.get_job_info(submission_id)
        if info.status.is_terminal():
            return info
        if time.monotonic() > deadline:
            client.stop_job(submission_id)
            pytest.fail(f"job {submission_id} still {info.status} after {JOB_TIMEOUT_SECONDS:g} s")
        time.sleep(0.5)


def _probe_report(client: Any, submission_id: str) -> dict[str, Any]:
    logs = client.get_job_logs(submission_id)
    lines = [line for line in logs.splitlines() if line.startswith("VRAMFIT_PROBE ")]
    assert lines, f"the job printed no report:\n{logs[-2000:]}"
    return json.loads(lines[-1].removeprefix("VRAMFIT_PROBE "))


def test_discovery_reads_gpu_types_and_free_gpus(local_cluster: LocalCluster) -> None:
    found = discover_pools(local_cluster.gcs_address, POOLS, timeout_seconds=20)
    by_name = {p.name: p for p in found.pools}
    assert set(by_name) == {"l40s", "h100"}
    assert (by_name["l40s"].gpus_per_node, by_name["l40s"].nodes, by_name["l40s"].free_gpus) == (4, 1, 4)
    assert (by_name["h100"].gpus_per_node, by_name["h100"].nodes, by_name["h100"].free_gpus) == (8, 1, 8)
    assert by_name["h100"].price_usd_per_gpu_hour == 2.99  # the price comes from the config
    assert found.node_ids == {"l40s": (local_cluster.l40s_node,), "h100": (local_cluster.h100_node,)}

    only_h100 = parse_pools({"pools": [POOLS.pools[1].model_dump()]})
    unpriced = discover_pools(local_cluster.gcs_address, only_h100, timeout_seconds=20)
    assert [p.name for p in unpriced.pools] == ["h100"]
    assert any("L40S" in w and "no price" in w for w in unpriced.warnings)


def test_tasks_and_workers_shaped_by_the_decision_run_on_the_h100_node(local_cluster: LocalCluster) -> None:
    found = discover_pools(local_cluster.gcs_address, POOLS, timeout_seconds=20)
    job = read_jobs(EXAMPLES / "llama-3.1-8b-full.yaml")[0]
    decision = place(job.spec, found.config(), base_dir=job.base_dir)
    assert decision.chosen is not None and decision.chosen.pool.name == "h100" and decision.chosen.gpus == 4
    kind = found.accelerator_type("h100")
    kwargs = scaling_config_kwargs(decision, kind)

    ray.init(address=local_cluster.gcs_address, logging_level="ERROR")
    try:
        @ray.remote(num_gpus=decision.chosen.gpus, accelerator_type=kind)
        def whole_job() -> tuple[str, list[Any], dict[str, float]]:
            ctx = ray.get_runtime_context()
            return ctx.get_node_id(), ray.get_gpu_ids(), ctx.get_assigned_resources()

        node_id, gpu_ids, assigned = ray.get(whole_job.remote(), timeout=60)
        assert node_id == local_cluster.h100_node
        assert len(gpu_ids) == 4 and assigned["GPU"] == 4

        # Ray Train's workers: one actor per worker with the ScalingConfig's per-worker resources.
        @ray.remote
        class Worker:
            def where(self) -> tuple[str, list[Any]]:
                return ray.get_runtime_context().get_node_id(), ray.get_gpu_ids()

        # Ray Train asks no CPU for a GPU worker; a sliver of accelerator_type:<TYPE> comes with accelerator_type.
        options = {"num_cpus": 0, "num_gpus": kwargs["resources_per_worker"]["GPU"],
                   "accelerator_type": kwargs["accelerator_type"]}
        workers = [Worker.options(**options).remote() for _ in range(kwargs["num_workers"])]
        placed = ray.get([w.where.remote() for w in workers], timeout=60)
        assert {n for n, _ in placed} == {local_cluster.h100_node}
        assert len({g for _, ids in placed for g in ids}) == 4  # four distinct GPUs held at once
        for w in workers:
            ray.kill(w)
    finally:
        ray.shutdown()

    train = pytest.importorskip("ray.train", reason="ray[train] not installed")
    config = train.ScalingConfig(**kwargs)
    assert (config.num_workers, config.num_gpus_per_worker, config.accelerator_type) == (4, 1, "H100")


def test_submit_job_runs_on_the_h100_node(local_cluster: LocalCluster) -> None:
    decision, submission_id = submit_job(
        EXAMPLES / "llama-3.1-8b-full.yaml", local_cluster.dashboard, POOLS, local_cluster.entrypoint(),
        gcs_address=local_cluster.gcs_address, metadata={"team": "test"}, timeout_seconds=20)
    assert decision.chosen is not None and decision.chosen.pool.name == "h100"
    client = job_client(local_cluster.dashboard)
    info = _wait(client, submission_id)
    assert info.status == "SUCCEEDED", client.get_job_logs(submission_id)[-2000:]
    assert info.driver_node_id == local_cluster.h100_node
    assert info.metadata["vramfit.pool"] == "h100" and info.metadata["team"] == "test"
    assert int(info.metadata["vramfit.predicted_peak_vram_bytes"]) == decision.chosen.peak_vram_bytes
    report = _probe_report(client, submission_id)
    assert report["env"]["VRAMFIT_ACCELERATOR_TYPE"] == "H100"
    assert report["env"]["VRAMFIT_NUM_GPUS"] == "4" and report["env"]["VRAMFIT_POOL"] == "h100"
    # each task holds the H100 node's accelerator_type resource (a node id reported from a task was seen, once,
    # to be another node's on this one-host cluster, where drivers attach to the head's raylet)
    assert all("accelerator_type:H100" in held and "GPU" in held for _, held in report["tasks"])
    assert report["cluster_resources"]["GPU"] == 4 + 8 + 1


def test_cli_submit_with_label_selector(local_cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["ray", "submit", str(EXAMPLES / "llama-3.1-8b-full.yaml"), "--address", local_cluster.dashboard,
                 "--gcs-address", local_cluster.gcs_address, "--label-selector", "--format", "json", "--",
                 *shlex.split(local_cluster.entrypoint())])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert out["request"]["entrypoint_label_selector"] == {"ray.io/accelerator-type": "H100"}
    client = job_client(local_cluster.dashboard)
    info = _wait(client, out["submission_id"])
    assert info.status == "SUCCEEDED" and info.driver_node_id == local_cluster.h100_node


def test_cli_submit_records_the_decision_where_the_reporter_posts(local_cluster: LocalCluster, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The decision goes to a real `vramfit serve --ledger` (started here on 127.0.0.1), and is read back from its
    SQLite ledger; the job's VramReporter is pointed at the same server, under the same decision id."""
    from scheduler.integrations.ledger import SqliteLedger
    from tests.integrations.processes import ServeProcess

    ledger_path = tmp_path / "ledger.sqlite"
    collector = ServeProcess(ledger_path, tmp_path / "serve.log")
    try:
        code = main(["ray", "submit", str(EXAMPLES / "llama-3.1-8b-full.yaml"), "--address", local_cluster.dashboard,
                     "--gcs-address", local_cluster.gcs_address, "--ledger-url", collector.url, "--format", "json",
                     "--", *shlex.split(local_cluster.entrypoint())])
        out = json.loads(capsys.readouterr().out)
        assert code == 0 and out["recorded"] is True, out
        ledger = SqliteLedger(ledger_path)
        try:
            decision = ledger.get_decision(out["decision_id"])
        finally:
            ledger.close()
        assert decision is not None, "the decision is not in the server's ledger"
        stored = decision.decision
        assert stored.name == out["submission_id"] and stored.kind == "RayJobSubmission"
        assert stored.pool == out["decision"]["pool"]
        # the job's VramReporter posts its actual there, under the same decision id
        env = out["request"]["runtime_env"]["env_vars"]
        assert env["VRAMFIT_URL"] == collector.url and env["VRAMFIT_DECISION_ID"] == out["decision_id"]
        assert _wait(job_client(local_cluster.dashboard), out["submission_id"]).status == "SUCCEEDED"
    finally:
        collector.stop()


def test_existing_submission_is_wrapped_and_lands_on_l40s(local_cluster: LocalCluster) -> None:
    submission = {
        "entrypoint": f"{local_cluster.entrypoint()} --model_name_or_path Qwen/Qwen2.5-0.5B --bf16 "
                      "--per_device_train_batch_size 2 --max_seq_length 1024",
        "runtime_env": {"env_vars": {"MY_SETTING": "kept"}},
        "entrypoint_num_gpus": 2,
        "metadata": {"owner": "test"},
    }
    plan = plan_submission(submission, POOLS, gcs_address=local_cluster.gcs_address, timeout_seconds=20)
    assert plan.job.kind == "RayJobSubmission" and plan.job.spec.gpus == 2
    decision, submission_id = submit_job(submission, local_cluster.dashboard, POOLS,
                                         gcs_address=local_cluster.gcs_address, timeout_seconds=20)
    assert decision.chosen is not None and decision.chosen.pool.name == "l40s"
    client = job_client(local_cluster.dashboard)
    info = _wait(client, submission_id)
    assert info.status == "SUCCEEDED", client.get_job_logs(submission_id)[-2000:]
    assert info.driver_node_id == local_cluster.l40s_node  # pinned by the accelerator_type:L40S resource
    assert info.runtime_env["env_vars"]["MY_SETTING"] == "kept" and info.metadata["owner"] == "test"
    report = _probe_report(client, submission_id)
    assert all("accelerator_type:L40S" in held and "GPU" in held for _, held in report["tasks"])


def test_too_large_job_is_refused_and_nothing_is_submitted(local_cluster: LocalCluster) -> None:
    client = job_client(local_cluster.dashboard)
    before = {j.submission_id for j in client.list_jobs()}
    with pytest.raises(JobRefused) as refused:
        submit_job(EXAMPLES / "llama-3.1-70b-too-big.yaml", local_cluster.dashboard, POOLS, "python train.py",
                   gcs_address=local_cluster.gcs_address, timeout_seconds=20)
    reasons = refused.value.decision.reasons
    assert {r.split(":")[0] for r in reasons} == {"l40s", "h100"}
    assert all("needs" in r for r in reasons)
    assert {j.submission_id for j in client.list_jobs()} == before


def test_a_pool_typed_only_by_label_gets_the_job_and_its_driver(local_cluster: LocalCluster, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A node typed only by its ray.io/accelerator-type label (as KubeRay's labels or `ray start --labels` give)
    has no accelerator_type:<TYPE> resource: a driver asking for a sliver of one would wait forever. Discovery
    marks its pool label-only and `vramfit ray submit` pins the driver there with entrypoint_label_selector,
    without --label-selector."""
    config = {"pools": [*(p.model_dump(exclude_none=True) for p in POOLS.pools), A100_POOL]}
    found = discover_pools(local_cluster.gcs_address, parse_pools(config), timeout_seconds=20)
    assert found.node_ids["a100"] == (local_cluster.a100_node,)
    assert found.label_only == frozenset({"a100"})  # the H100 node has both the label and the resource
    pools_file = tmp_path / "pools.json"
    pools_file.write_text(json.dumps(config), encoding="utf-8")

    code = main(["ray", "submit", str(EXAMPLES / "llama-3.1-8b-lora.yaml"), "--address", local_cluster.dashboard,
                 "--gcs-address", local_cluster.gcs_address, "--pools", str(pools_file), "--timeout", "30",
                 "--format", "json", "--",
                 *shlex.split(local_cluster.entrypoint(local_cluster.label_probe))])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out = json.loads(captured.out)
    assert out["decision"]["pool"] == "a100" and out["ray_accelerator_type"] == "A100"
    assert out["request"]["entrypoint_label_selector"] == {"ray.io/accelerator-type": "A100"}
    assert not any(k.startswith("accelerator_type:") for k in out["request"].get("entrypoint_resources") or {})
    client = job_client(local_cluster.dashboard)
    info = _wait(client, out["submission_id"])
    assert info.status == "SUCCEEDED", client.get_job_logs(out["submission_id"])[-2000:]
    assert info.driver_node_id == local_cluster.a100_node  # not the head, where Ray puts an unpinned driver
    report = _probe_report(client, out["submission_id"])
    assert report["driver_node"] == local_cluster.a100_node
    assert report["driver_labels"]["ray.io/accelerator-type"] == "A100"
    assert report["env"]["VRAMFIT_POOL"] == "a100" and report["env"]["VRAMFIT_ACCELERATOR_TYPE"] == "A100"
    # the workers are steered as the driver was pinned (VRAMFIT_PIN=label): accelerator_type=A100 would ask for a
    # resource the node does not have, and they would wait forever
    assert report["env"]["VRAMFIT_PIN"] == "label"
    assert report["scaling"]["label_selector"] == {"ray.io/accelerator-type": "A100"}
    assert "accelerator_type" not in report["scaling"]
    assert report["tasks"] == [local_cluster.a100_node] * int(report["env"]["VRAMFIT_NUM_GPUS"])
