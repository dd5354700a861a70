"""The plain manifests under deploy/: valid, consistent with each other, and in step with the chart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.deploy.manifests import (
    assert_valid,
    cross_reference_problems,
    load_documents,
    manifest_problems,
    rule_groups_problems,
)

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
NAMESPACE = "vramfit-system"
MANIFEST_FILES = (sorted(DEPLOY.glob("*.yaml")) + sorted((DEPLOY / "monitoring").glob("*.yaml"))
                  + sorted((DEPLOY / "network").glob("*.yaml")))


def all_deploy_documents() -> list[dict]:
    return [doc for path in MANIFEST_FILES for doc in load_documents(path.read_text())]


def test_deploy_holds_the_expected_files() -> None:
    names = {p.relative_to(DEPLOY).as_posix() for p in DEPLOY.rglob("*") if p.is_file()}
    assert {
        "grafana/vramfit-dashboard.json",
        "prometheus/vramfit-rules.yaml",
        "prometheus/vramfit-rules.test.yaml",
        "monitoring/servicemonitor.yaml",
        "network/networkpolicy.yaml",
    } <= names
    # Every YAML file is either a manifest file or one of the two Prometheus files.
    yaml_files = {p for p in DEPLOY.rglob("*.yaml")}
    assert yaml_files == set(MANIFEST_FILES) | set((DEPLOY / "prometheus").glob("*.yaml"))


@pytest.mark.parametrize("path", MANIFEST_FILES, ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_every_manifest_validates(path: Path) -> None:
    docs = load_documents(path.read_text())
    assert docs, f"{path} holds no documents"
    assert_valid(docs)


def test_every_kind_is_present_once_or_as_expected() -> None:
    kinds = sorted(d["kind"] for d in all_deploy_documents())
    assert kinds == sorted(
        [
            "Namespace",
            "ServiceAccount", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
            "ConfigMap",
            "Deployment", "PodDisruptionBudget", "Service",
            "PersistentVolumeClaim", "Deployment", "Service",
            "Issuer", "Certificate", "Issuer", "Certificate",
            "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
            "ServiceMonitor", "ServiceMonitor",
            "NetworkPolicy", "NetworkPolicy",
        ]
    )


def test_namespaced_objects_live_in_vramfit_system() -> None:
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
    for doc in all_deploy_documents():
        if doc["kind"] in cluster_scoped or doc["kind"].endswith("WebhookConfiguration"):
            assert "namespace" not in doc["metadata"], doc["metadata"]["name"]
        else:
            assert doc["metadata"]["namespace"] == NAMESPACE, (doc["kind"], doc["metadata"]["name"])


def test_cross_references() -> None:
    assert cross_reference_problems(all_deploy_documents(), NAMESPACE) == []


def test_cross_reference_check_catches_a_ledger_url_that_misses_the_collector() -> None:
    docs = all_deploy_documents()
    webhook = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "vramfit-webhook")
    args = webhook["spec"]["template"]["spec"]["containers"][0]["args"]
    args[args.index("--ledger-url=http://vramfit-collector.vramfit-system.svc:8080")] = (
        "--ledger-url=http://vramfit-collector.vramfit-system.svc:9400")
    problems = cross_reference_problems(docs, NAMESPACE)
    assert any("--ledger-url" in p and "port 9400" in p for p in problems), problems


def test_cross_reference_check_catches_a_wrong_service_name() -> None:
    docs = all_deploy_documents()
    for doc in docs:
        if doc["kind"] == "Certificate" and not doc["spec"].get("isCA"):
            doc["spec"]["dnsNames"] = ["vramfit-webhook.default.svc"]
        if doc["kind"] == "ValidatingWebhookConfiguration":
            doc["webhooks"][0]["clientConfig"]["service"]["path"] = "/mutate"
    problems = cross_reference_problems(docs, NAMESPACE)
    assert any("dnsNames lack vramfit-webhook.vramfit-system.svc" in p for p in problems)
    assert any("webhook paths" in p for p in problems)


def test_validation_catches_unknown_fields_and_bad_enums() -> None:
    [mutating, _] = load_documents((DEPLOY / "60-webhooks.yaml").read_text())
    mutating["webhooks"][0]["failurePolicy"] = "Sometimes"
    mutating["webhooks"][0]["sideEffect"] = "None"
    problems = manifest_problems(mutating)
    assert any("sideEffect" in p and "unexpected" in p for p in problems)
    assert any("failurePolicy must be Fail or Ignore" in p for p in problems)


def test_webhooks_opt_in_gpu_objects_only() -> None:
    docs = load_documents((DEPLOY / "60-webhooks.yaml").read_text())
    for doc in docs:
        [hook] = doc["webhooks"]
        assert hook["sideEffects"] == "NoneOnDryRun"
        assert {"key": "vramfit.io/enabled", "operator": "In", "values": ["true"]} in hook["namespaceSelector"][
            "matchExpressions"
        ]
        assert all(r["operations"] == ["CREATE"] for r in hook["rules"])
        resources = {(g, r) for rule in hook["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
        assert resources == {
            ("", "pods"), ("batch", "jobs"), ("jobset.x-k8s.io", "jobsets"), ("kubeflow.org", "pytorchjobs"),
            ("trainer.kubeflow.org", "trainjobs"), ("ray.io", "rayjobs"), ("ray.io", "rayclusters"),
            ("batch.volcano.sh", "jobs"),
        }
        gpu_conditions = [c for c in hook["matchConditions"] if c["name"].endswith("-requesting-gpus")]
        assert len(gpu_conditions) == 2 and all("nvidia.com/gpu" in c["expression"] for c in gpu_conditions)


def test_the_webhook_can_read_its_pools_and_they_are_the_embedded_ones() -> None:
    """What `vramfit serve --pools` reads from the ConfigMap loads with vramfit's own loader (it did not:
    `interconnect: pcie` was refused, so the webhook could not start), and is the embedded default, so that
    `vramfit place` without --pools and the webhook agree."""
    from scheduler.pools import default_pools, parse_pools

    [configmap] = load_documents((DEPLOY / "20-pools-configmap.yaml").read_text())
    config = parse_pools(yaml.safe_load(configmap["data"]["pools.yaml"]))
    assert config.headroom_fraction == 0.05
    assert [p.model_dump() for p in config.pools] == [p.model_dump() for p in default_pools().pools]


def test_pools_config_is_strict_yaml_with_four_priced_pools() -> None:
    [configmap] = load_documents((DEPLOY / "20-pools-configmap.yaml").read_text())
    config = yaml.safe_load(configmap["data"]["pools.yaml"])
    assert set(config) == {"headroom_fraction", "pools"}
    assert config["headroom_fraction"] == 0.05
    prices = {p["gpu"]: p["price_usd_per_gpu_hour"] for p in config["pools"]}
    assert prices == {"L40S": 1.45, "A100-80GB": 1.83, "H100-80GB": 2.99, "B200": 4.99}
    allowed = {
        "name", "gpu", "gpus_per_node", "nodes", "price_usd_per_gpu_hour", "price_source", "free_gpus",
        "node_selector", "tolerations", "interconnect", "max_gpus_per_job",
    }
    for pool in config["pools"]:
        assert set(pool) <= allowed, set(pool) - allowed
        assert pool["node_selector"]["nvidia.com/gpu.product"].startswith("NVIDIA-")
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pool["tolerations"]


def test_gpu_names_in_pools_are_in_the_catalog() -> None:
    from predictors.hardware import lookup_gpu

    [configmap] = load_documents((DEPLOY / "20-pools-configmap.yaml").read_text())
    for pool in yaml.safe_load(configmap["data"]["pools.yaml"])["pools"]:
        assert lookup_gpu(pool["gpu"]).name == pool["gpu"]


def test_rule_file_is_well_formed() -> None:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "vramfit-rules.yaml").read_text())
    assert set(rules) == {"groups"}
    assert rule_groups_problems(rules["groups"]) == []
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert alerts == {
        "VramfitUnderPredictionRateHigh",
        "VramfitOomAfterPlacement",
        "VramfitWebhookErrors",
        "VramfitWebhookLatencyHigh",
    }


DASHBOARD_METRICS = (  # the series scheduler/integrations/metrics.py exports
    "vramfit_vram_prediction_ratio_bucket",
    "vramfit_vram_prediction_ratio_count",
    "vramfit_vram_under_predictions_total",
    "vramfit_ooms_total",
    "vramfit_predicted_peak_vram_bytes_sum",
    "vramfit_actual_peak_vram_bytes_sum",
    "vramfit_runtime_prediction_ratio_bucket",
    "vramfit_admission_request_duration_seconds_bucket",
    "vramfit_placements_total",
    "vramfit_predicted_cost_usd_total",
    "vramfit_actuals_received_total",
    "vramfit_residual_model_info",
    "vramfit_residual_model_reloads_total",
)


def test_dashboard_queries_every_metric() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "vramfit-dashboard.json").read_text())
    assert dashboard["uid"] == "vramfit-accuracy"
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    exprs = " ".join(t["expr"] for p in panels for t in p["targets"])
    for metric in DASHBOARD_METRICS:
        assert metric in exprs, metric
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]


def test_the_webhook_drains_before_it_stops() -> None:
    """A preStop pause keeps the webhook answering while it leaves the Service's endpoints, and the grace period
    holds that pause, serve's shutdown timeout (10 s) and the forwarder's flush (5 s)."""
    from scheduler.cli.server_common import DEFAULT_SHUTDOWN_TIMEOUT_SECONDS

    deployment = next(d for d in all_deploy_documents()
                      if d["kind"] == "Deployment" and d["metadata"]["name"] == "vramfit-webhook")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    pause = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pause[0] == "sleep" and int(pause[1]) >= 5
    assert pod["terminationGracePeriodSeconds"] >= int(pause[1]) + DEFAULT_SHUTDOWN_TIMEOUT_SECONDS + 5
