"""The Ray adapter without Ray: discovery from plain node values, the submission it builds, the Ray Train
arguments, and the CLI's answers when there is no cluster. The live-cluster tests are in test_ray.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scheduler.cli import main
from scheduler.integrations.ray.connection import RayIntegrationError, bounded, gcs_address_for, split_host_port
from scheduler.integrations.ray.discovery import (
    RayNode,
    configured_pools,
    pools_from_nodes,
    ray_accelerator_type,
    shape_pool_name,
)
from scheduler.integrations.ray.submit import (
    DRIVER_PIN_AMOUNT,
    ENV_ACCELERATOR_TYPE,
    ENV_NUM_GPUS,
    JobRefused,
    build_request,
    load_job,
    plan_submission,
)
from scheduler.integrations.ray.train import scaling_config_kwargs, scaling_config_kwargs_from_env
from scheduler.placement import place
from scheduler.pools import parse_pools

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"

POOLS = parse_pools({"pools": [
    {"name": "l40s", "gpu": "L40S", "gpus_per_node": 8, "nodes": 4, "price_usd_per_gpu_hour": 1.45,
     "node_selector": {"nvidia.com/gpu.product": "NVIDIA-L40S"}},
    {"name": "h100", "gpu": "H100-80GB", "gpus_per_node": 8, "nodes": 4, "price_usd_per_gpu_hour": 2.99},
    {"name": "h100-spot", "gpu": "H100-80GB", "gpus_per_node": 8, "nodes": 2, "price_usd_per_gpu_hour": 1.99},
    {"name": "a100-40", "gpu": "A100-40GB", "gpus_per_node": 8, "nodes": 1, "price_usd_per_gpu_hour": 1.10},
]})


def node(node_id: str, gpus: float, free: float, ray_type: str | None = None, label: str | None = None,
         **extra: float) -> RayNode:
    total = {"CPU": 8.0, "GPU": gpus, **extra}
    if ray_type:
        total[f"accelerator_type:{ray_type}"] = gpus
    labels = {"ray.io/accelerator-type": label} if label else {}
    return RayNode(node_id, total, {**total, "GPU": free}, labels)


def test_nodes_become_priced_pools_with_free_gpus() -> None:
    nodes = [
        node("head0000", 0, 0),
        node("l40s0001", 4, 4, "L40S"),
        node("l40s0002", 4, 1.5, "L40S"),
        node("h1000001", 8, 8, label="H100"),
    ]
    found = pools_from_nodes(nodes, POOLS)
    by_name = {p.name: p for p in found.pools}
    assert set(by_name) == {"l40s", "h100-spot"}
    l40s = by_name["l40s"]
    assert (l40s.gpus_per_node, l40s.nodes, l40s.free_gpus) == (4, 2, 5)  # 1.5 free GPUs count as 1
    assert l40s.node_selector == {"nvidia.com/gpu.product": "NVIDIA-L40S"}  # kept from the config
    assert found.accelerator_types == {"l40s": "L40S", "h100-spot": "H100"}
    assert found.node_ids["h100-spot"] == ("h1000001",)
    # two H100 pools in the config: Ray cannot tell them apart, the cheaper one is used and it is said
    assert any("h100-spot and h100" in w for w in found.warnings)
    assert any("a100-40" in w and "no nodes" in w for w in found.warnings)


def test_unpriced_unknown_and_untyped_gpus_are_left_out_with_reasons() -> None:
    nodes = [node("a10g0001", 1, 1, "A10G"), node("k80x0001", 4, 4, "K80"), node("anon0001", 2, 2),
             node("h1000001", 8, 8, "H100")]
    found = pools_from_nodes(nodes, POOLS)
    assert [p.name for p in found.pools] == ["h100-spot"]
    text = "\n".join(found.warnings)
    assert "A10G" in text and "no price" in text  # priced nowhere: never guessed
    assert "K80 on 1 node(s) is not in the GPU catalog" in text
    assert "anon0001 has 2 GPUs of unknown type" in text


def test_nothing_priced_is_an_error_listing_why() -> None:
    found = pools_from_nodes([node("a10g0001", 1, 1, "A10G")], POOLS)
    with pytest.raises(RayIntegrationError, match=r"(?s)no priced GPU pool.*A10G"):
        found.config()


def test_bare_a100_maps_onto_the_configured_variant_and_shapes_split() -> None:
    nodes = [node("a1000001", 8, 8, "A100"), node("l40s0001", 4, 4, "L40S"), node("l40s0002", 8, 2, "L40S")]
    found = pools_from_nodes(nodes, POOLS)
    by_name = {p.name: p for p in found.pools}
    assert by_name["a100-40"].gpu == "A100-40GB"  # Ray says "A100"; the config prices the 40 GB card
    assert any("configured variant" in w for w in found.warnings)
    assert {"l40s-l40s-4gpu", "l40s-l40s-8gpu"} <= set(by_name)
    assert by_name["l40s-l40s-8gpu"].free_gpus == 2


def test_bare_type_with_two_configured_variants_is_flagged() -> None:
    pools = parse_pools({"pools": [
        {"name": "a100-80", "gpu": "A100-80GB", "gpus_per_node": 8, "nodes": 1, "price_usd_per_gpu_hour": 1.8},
        {"name": "a100-40", "gpu": "A100-40GB", "gpus_per_node": 8, "nodes": 1, "price_usd_per_gpu_hour": 1.1},
    ]})
    found = pools_from_nodes([node("a1000001", 8, 8, "A100")], pools)
    assert [p.gpu for p in found.pools] == ["A100-80GB"]
    assert any("does not tell A100-80GB from A100-40GB" in w for w in found.warnings)
    labelled = pools_from_nodes([node("a1000001", 8, 8, "A100", label="A100-40GB")], pools)
    assert [p.gpu for p in labelled.pools] == ["A100-40GB"]


def test_label_and_resource_disagreeing_uses_the_label() -> None:
    found = pools_from_nodes([node("mixed001", 8, 8, "L40S", label="H100")], POOLS)
    assert found.accelerator_types == {"h100-spot": "H100"}
    assert any("using the label" in w for w in found.warnings)


@pytest.mark.parametrize(("gpu", "ray_type"), [("H100-80GB", "H100"), ("A100-40GB", "A100"), ("L40S", "L40S"),
                                               ("A10G", "A10G"), ("T4", "T4"), ("RTX-4090", "RTX-4090")])
def test_catalog_to_ray_type(gpu: str, ray_type: str) -> None:
    assert ray_accelerator_type(gpu) == ray_type


def _decision(path: str = "llama-3.1-8b-full.yaml"):  # type: ignore[no-untyped-def]
    job, _ = load_job(EXAMPLES / path)
    pools = pools_from_nodes([node("l40s0001", 4, 4, "L40S"), node("h1000001", 8, 8, "H100")], POOLS)
    return place(job.spec, pools.config(), base_dir=job.base_dir)


def test_request_pins_the_driver_and_carries_the_decision() -> None:
    decision = _decision()
    assert decision.chosen is not None and decision.chosen.pool.gpu == "H100-80GB"
    base = {"entrypoint": "python train.py", "runtime_env": {"env_vars": {"HF_HOME": "/cache"}, "pip": ["x"]},
            "metadata": {"team": "nlp"}, "entrypoint_resources": {"accelerator_type:A10G": 0.5, "disk": 1}}
    req = build_request(decision, "H100", "vf-1", base=base)
    assert req.entrypoint == "python train.py"
    assert req.entrypoint_resources == {"disk": 1.0, "accelerator_type:H100": DRIVER_PIN_AMOUNT}
    assert req.runtime_env["pip"] == ["x"]
    env = req.runtime_env["env_vars"]
    assert env["HF_HOME"] == "/cache" and env[ENV_ACCELERATOR_TYPE] == "H100" and env[ENV_NUM_GPUS] == "4"
    assert req.metadata["team"] == "nlp" and req.metadata["vramfit.pool"] == "h100-spot"
    assert int(req.metadata["vramfit.predicted_peak_vram_bytes"]) == decision.chosen.peak_vram_bytes
    assert all(isinstance(v, str) for v in req.metadata.values())
    assert base["runtime_env"]["env_vars"] == {"HF_HOME": "/cache"}  # the caller's dict is not changed
    kwargs = req.submit_kwargs()
    assert "entrypoint_label_selector" not in kwargs and "entrypoint_num_gpus" not in kwargs


def test_request_with_label_selector_and_driver_gpus() -> None:
    req = build_request(_decision(), "H100", "vf-1", "torchrun --nproc-per-node 4 train.py",
                        driver_gpus=True, use_label_selector=True)
    assert req.entrypoint_label_selector == {"ray.io/accelerator-type": "H100"}
    assert req.entrypoint_resources is None
    assert req.entrypoint_num_gpus == 4


@pytest.mark.parametrize(("entrypoint", "base", "message"), [
    (None, None, "entrypoint.*is missing"),
    ("python a.py", {"entrypoint": "python b.py"}, "given twice"),
    ("python a.py", {"entrypoint_gpus": 1}, "not a Ray Jobs submission field"),
])
def test_request_input_errors(entrypoint: str | None, base: dict | None, message: str) -> None:
    from predictors.errors import SpecError

    with pytest.raises(SpecError, match=message):
        build_request(_decision(), "H100", "vf-1", entrypoint, base)


def test_refused_decision_builds_nothing() -> None:
    decision = _decision("llama-3.1-70b-too-big.yaml")
    assert decision.decision == "unschedulable"
    with pytest.raises(JobRefused, match="nothing submitted"):
        build_request(decision, "H100", "vf-1", "python train.py")


def test_existing_ray_submission_is_parsed_and_kept() -> None:
    submission = {
        "entrypoint": "python -m torch.distributed.run --nproc-per-node 8 finetune.py --model_name_or_path "
                      "Qwen/Qwen2.5-1.5B --bf16 --per_device_train_batch_size 1 --max_seq_length 4096 "
                      "--gradient_checkpointing",
        "runtime_env": {"env_vars": {"WANDB_MODE": "offline"}},
        "entrypoint_num_gpus": 8,
        "metadata": {"owner": "ana"},
    }
    job, base = load_job(submission)
    assert base == submission and job.kind == "RayJobSubmission" and job.spec.gpus == 8
    plan = plan_submission(submission, POOLS, discover=False)
    assert plan.request is not None
    assert plan.request.entrypoint == submission["entrypoint"]
    assert plan.request.entrypoint_num_gpus == 8
    assert plan.request.metadata["owner"] == "ana"
    assert plan.request.runtime_env["env_vars"]["WANDB_MODE"] == "offline"


def test_scaling_config_kwargs() -> None:
    decision = _decision()
    assert scaling_config_kwargs(decision, "H100") == {
        "num_workers": 4, "use_gpu": True, "resources_per_worker": {"GPU": 1}, "accelerator_type": "H100"}
    kwargs = scaling_config_kwargs(decision, gpus_per_worker=2, use_label_selector=True)
    assert kwargs["num_workers"] == 2 and kwargs["label_selector"] == {"ray.io/accelerator-type": "H100"}
    with pytest.raises(ValueError, match="must divide"):
        scaling_config_kwargs(decision, gpus_per_worker=3)
    env = {"VRAMFIT_NUM_GPUS": "8", "VRAMFIT_ACCELERATOR_TYPE": "L40S"}
    assert scaling_config_kwargs_from_env(env)["num_workers"] == 8
    # workers are steered as the driver was pinned: by label on a label-only pool
    assert scaling_config_kwargs_from_env(env | {"VRAMFIT_PIN": "label"})["label_selector"] == {
        "ray.io/accelerator-type": "L40S"}
    assert scaling_config_kwargs_from_env(env | {"VRAMFIT_PIN": "resource"})["accelerator_type"] == "L40S"
    assert "accelerator_type" in scaling_config_kwargs_from_env(env | {"VRAMFIT_PIN": "label"},
                                                                use_label_selector=False)
    with pytest.raises(RayIntegrationError, match="not submitted by vramfit"):
        scaling_config_kwargs_from_env({})


def test_configured_pools_route_by_catalog() -> None:
    routes = configured_pools(POOLS).accelerator_types
    assert routes == {"l40s": "L40S", "h100": "H100", "h100-spot": "H100", "a100-40": "A100"}


def test_addresses_and_bounded_calls() -> None:
    assert split_host_port("http://10.0.0.5:8265", 1) == ("10.0.0.5", 8265)
    assert split_host_port("head:6380", 1) == ("head", 6380)
    assert gcs_address_for("http://ray-head:8265") == "ray-head:6379"
    assert bounded(lambda: 3, 1.0, "x") == 3
    import time

    with pytest.raises(RayIntegrationError, match="did not answer within"):
        bounded(lambda: time.sleep(5), 0.2, "the slow thing")


def test_cli_dry_run_without_a_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["ray", "submit", str(EXAMPLES / "llama-3.1-8b-full.yaml"), "--no-discover", "--dry-run",
                 "--format", "json", "--", "python", "train.py", "--lr", "1e-5"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["submission_id"] is None
    assert out["request"]["entrypoint"] == "python train.py --lr 1e-5"
    assert out["request"]["runtime_env"]["env_vars"]["VRAMFIT_ACCELERATOR_TYPE"] == out["ray_accelerator_type"]


def test_cli_refusal_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["ray", "submit", str(EXAMPLES / "llama-3.1-70b-too-big.yaml"), "--no-discover", "--dry-run",
                 "--", "python", "train.py"])
    out = capsys.readouterr().out
    assert code == 1
    assert "refused" in out and "needs" in out  # the per-pool reasons


@pytest.mark.parametrize("argv", [
    ["ray", "pools", "--gcs-address", "127.0.0.1:9"],
    ["ray", "submit", str(EXAMPLES / "llama-3.1-8b-lora.yaml"), "--address", "http://127.0.0.1:9", "--", "true"],
])
def test_cli_no_cluster_exits_2_without_a_traceback(argv: list[str]) -> None:
    pytest.importorskip("ray")
    runner = "import sys; from scheduler.cli import main; sys.exit(main())"
    result = subprocess.run([sys.executable, "-c", runner, *argv], capture_output=True, text=True, timeout=60,
                            cwd=REPO)
    assert result.returncode == 2
    assert "no Ray GCS at 127.0.0.1" in result.stderr and "Traceback" not in result.stderr


def test_ray_missing_says_which_extra(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    assert main(["ray", "pools", "--gcs-address", "127.0.0.1:9"]) == 2
    assert "vramfit[ray]" in capsys.readouterr().err


def test_core_and_package_import_without_ray() -> None:
    code = ("import sys; import scheduler.placement, scheduler.integrations.ray, scheduler.cli; "
            "assert 'ray' not in sys.modules, 'ray imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=REPO)


@pytest.mark.parametrize(("fields", "fragment"), [
    ({"entrypoint_resources": {"custom": "lots"}}, "`entrypoint_resources.custom` must be a finite number"),
    ({"entrypoint_resources": {"custom": float("nan")}}, "`entrypoint_resources.custom` must be a finite number"),
    ({"submission_id": 12345}, "`submission_id` must be a string; got 12345"),
    ({"entrypoint_num_cpus": "x"}, "`entrypoint_num_cpus` must be a finite number"),
])
def test_submission_fields_ray_takes_are_typed_before_placing(tmp_path: Path, fields: dict[str, Any], fragment: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    submission = {"entrypoint": "python train.py --model_name_or_path Qwen/Qwen2.5-0.5B --bf16",
                  "entrypoint_num_gpus": 1, **fields}
    path = tmp_path / "submission.json"
    path.write_text(json.dumps(submission))
    assert main(["ray", "submit", str(path), "--no-discover", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err


def test_a_pool_typed_only_by_label_is_marked_label_only() -> None:
    """Nodes typed only by the ray.io/accelerator-type label have no accelerator_type:<T> resource to pin a driver
    with; their pool is marked so (the submission then pins by label: test_ray.py, on a live cluster)."""
    labelled = RayNode("abcdef0123", {"GPU": 8, "CPU": 32}, {"GPU": 8, "CPU": 32}, {"ray.io/accelerator-type": "H100"})
    cluster = pools_from_nodes([labelled], POOLS)
    assert cluster.label_only == frozenset(p.name for p in cluster.pools) == frozenset({"h100-spot"})
    resourced = RayNode("0123abcdef", {"GPU": 8, "CPU": 32, "accelerator_type:H100": 1},
                        {"GPU": 8, "CPU": 32, "accelerator_type:H100": 1}, {})
    assert pools_from_nodes([resourced], POOLS).label_only == frozenset()
    # one node of the pool without the resource is enough: a driver pinned by the resource could not go there
    assert pools_from_nodes([labelled, resourced], POOLS).label_only == frozenset({"h100-spot"})


def test_the_dry_run_text_shows_everything_submitted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    submission = {"entrypoint": "python train.py --model_name_or_path Qwen/Qwen2.5-0.5B --bf16",
                  "entrypoint_num_gpus": 1, "entrypoint_num_cpus": 4, "metadata": {"owner": "t"},
                  "runtime_env": {"working_dir": "s3://bucket/code.zip", "env_vars": {"MY_SETTING": "kept"}}}
    path = tmp_path / "submission.json"
    path.write_text(json.dumps(submission))
    assert main(["ray", "submit", str(path), "--no-discover", "--dry-run"]) == 0
    out = capsys.readouterr().out
    for shown in ("entrypoint_num_cpus: 4", "env (the job's): MY_SETTING=kept",
                  'runtime_env: {"working_dir": "s3://bucket/code.zip"}', '"owner": "t"', "VRAMFIT_DECISION_ID="):
        assert shown in out


@pytest.mark.parametrize("timeout", ["-1", "nan", "inf", "0"])
def test_a_timeout_that_is_no_positive_time_is_refused(timeout: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ray", "pools", "--timeout", timeout]) == 2
    assert "--timeout must be a number of seconds, at least 0.1" in capsys.readouterr().err


def test_a_shape_pool_name_never_exceeds_a_label_value() -> None:
    """Two node shapes of one configured pool are named `{pool}-{type}-{n}gpu`; with a long (valid, 63-character)
    configured name that was over 63 characters and discovery crashed validating it."""
    config = parse_pools({"pools": [{"name": "l" * 63, "gpu": "L40S", "gpus_per_node": 8, "nodes": 4,
                                     "price_usd_per_gpu_hour": 1.45}]})
    nodes = [node("l40s0001", 4, 4, "L40S"), node("l40s0002", 8, 2, "L40S")]
    found = pools_from_nodes(nodes, config)
    names = [p.name for p in found.pools]
    assert len(set(names)) == 2 and all(len(n) <= 63 for n in names)
    assert names[0].endswith("-l40s-4gpu") and names[1].endswith("-l40s-8gpu")
    assert names == [p.name for p in pools_from_nodes(nodes, config).pools]  # the same every time
    assert set(found.accelerator_types) == set(names)
    # short names are unchanged
    assert shape_pool_name("l40s", "L40S", 4) == "l40s-l40s-4gpu"
    assert len(shape_pool_name("a", "x" * 80, 8)) == 63


def test_a_node_with_more_gpus_than_a_pool_node_may_have_is_left_out() -> None:
    """A Ray node declaring 128 logical GPUs made discovery crash on the pool's gpus_per_node limit (64)."""
    found = pools_from_nodes([node("big00001", 128, 128, "L40S"), node("l40s0001", 8, 8, "L40S")], POOLS)
    assert [(p.name, p.gpus_per_node) for p in found.pools] == [("l40s", 8)]
    assert any("declare 128 GPUs each" in w and "left out" in w for w in found.warnings)


def test_a_token_auth_error_names_the_fix() -> None:
    from scheduler.integrations.ray.connection import auth_hint

    error = RuntimeError("RPC error: InvalidAuthToken: Authentication token is missing or incorrect.")
    assert "RAY_AUTH_MODE=token" in auth_hint(error) and "RAY_AUTH_TOKEN" in auth_hint(error)
    assert auth_hint(RuntimeError("connection refused")) == ""
