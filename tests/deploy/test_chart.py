"""The Helm chart, rendered by the Helm engine that helm-python-sdk bundles (no helm binary, no cluster)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.manifests import (
    Manifest,
    assert_valid,
    cross_reference_problems,
    load_documents,
    webhook_deployment,
)

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (the Helm engine) is not installed")

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "vramfit"
DEPLOY = REPO / "deploy"
NAMESPACE = "vramfit-system"

FAKE_CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()
PROVIDED_SECRET = {"tls": {"certManager": {"enabled": False}, "secretName": "my-webhook-tls", "caBundle": FAKE_CA}}
MONITORING_ON = {
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "prometheusRule": {"enabled": True},
    "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "GPU"}},
    "collector": {"serviceMonitor": {"enabled": True}},
}

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "provided-secret": PROVIDED_SECRET,
    "failure-policy-ignore": {"webhook": {"failurePolicy": "Ignore", "timeoutSeconds": 3}},
    "monitoring-on": MONITORING_ON,
    "monitoring-on-provided-secret": {**MONITORING_ON, **PROVIDED_SECRET},
    "kueue": {"kueue": {"enabled": True}},
    "lean": {
        "webhook": {
            "replicas": 1,
            "podAntiAffinity": "hard",
            "namespaceSelector": {"optIn": False},
            "matchConditions": {"enabled": False},
        },
        "collector": {"enabled": False},
    },
    "collector-existing-claim": {"collector": {"persistence": {"existingClaim": "ledger-data"}}},
    "cluster-models": {"residualModels": {"volume": {"persistentVolumeClaim": {"claimName": "vramfit-models",
                                                                               "readOnly": True}},
                                          "vramModel": "site/vram.skops", "runtimeModel": "runtime.skops"}},
    "collector-no-persistence": {"collector": {"persistence": {"enabled": False}}},
    "ledger-token-dcgm": {"ledgerAuth": {"existingSecret": "vramfit-ledger-token"},
                          "collector": {"prometheusUrl": "http://prometheus-operated.monitoring:9090",
                                        "kube": {"namespace": "ml"}}},
    "network-policy": {"networkPolicy": {"enabled": True}, "webhook": {"namespaceSelector": {"optIn": False}}},
    "collector-other-port": {"collector": {"port": 9090, "serviceMonitor": {"enabled": False}},
                             "serviceMonitor": {"enabled": True}},
    "everything": {
        **MONITORING_ON,
        "kueue": {"enabled": True, "flavorLabelKey": "example.com/pool"},
        "webhook": {"replicas": 3, "extraArgs": ["--log-level=debug"], "nodeSelector": {"role": "system"}},
        "imagePullSecrets": [{"name": "ghcr"}],
    },
}


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render(chart: Any, values: dict[str, Any], *, name: str = "vramfit", namespace: str = NAMESPACE) -> list[Manifest]:
    rendered = chart.render(values, name=name, namespace=namespace)
    return [doc for path, text in sorted(rendered.items()) if path.endswith(".yaml") for doc in load_documents(text)]


def notes(chart: Any, values: dict[str, Any]) -> str:
    return chart.render(values, name="vramfit", namespace=NAMESPACE)["vramfit/templates/NOTES.txt"]


def only(docs: list[Manifest], kind: str) -> Manifest:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def kinds(docs: list[Manifest]) -> list[str]:
    return sorted(d["kind"] for d in docs)


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_rendered_manifest_validates(chart: Any, values: dict[str, Any]) -> None:
    docs = render(chart, values)
    assert_valid(docs)
    claims = [values.get("collector", {}).get("persistence", {}).get("existingClaim"),
              values.get("residualModels", {}).get("volume", {}).get("persistentVolumeClaim", {}).get("claimName")]
    existing = [("PersistentVolumeClaim", claim) for claim in claims if claim]
    assert cross_reference_problems(docs, NAMESPACE, existing) == []


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_the_rendered_pools_load_with_vramfits_own_loader(chart: Any, values: dict[str, Any]) -> None:
    """The pools.yaml the webhook reads (`vramfit serve --pools`) must load, or the webhook cannot start; the
    chart's default used to write `interconnect: pcie`, which the loader refused."""
    from scheduler.pools import parse_pools

    [configmap] = [d for d in render(chart, values) if d["kind"] == "ConfigMap" and "pools.yaml" in d["data"]]
    assert parse_pools(yaml.safe_load(configmap["data"]["pools.yaml"])).pools


def test_interconnect_words_and_bandwidths_pass_the_schema_and_the_loader(chart: Any) -> None:
    from scheduler.pools import parse_pools

    pool = {"name": "a", "gpu": "L40S", "gpus_per_node": 4, "nodes": 1, "price_usd_per_gpu_hour": 1,
            "node_selector": {"a": "b"}}
    for link in ("pcie", {"inter_node_bytes_per_second": 12.5e9}):
        [configmap] = [d for d in render(chart, {"pools": [{**pool, "interconnect": link}]})
                       if d["kind"] == "ConfigMap" and "pools.yaml" in d["data"]]
        assert parse_pools(yaml.safe_load(configmap["data"]["pools.yaml"])).pools[0].interconnect is not None
    with pytest.raises(helm.HelmValuesError):
        chart.render({"pools": [{**pool, "interconnect": "infiniband"}]}, name="vramfit", namespace=NAMESPACE)


def test_another_release_name_and_namespace(chart: Any) -> None:
    docs = render(chart, {}, name="gpu-sched", namespace="platform")
    assert_valid(docs)
    assert cross_reference_problems(docs, "platform") == []
    services = sorted(d["metadata"]["name"] for d in docs if d["kind"] == "Service")
    assert services == ["gpu-sched-vramfit-collector", "gpu-sched-vramfit-webhook"]
    for doc in docs:
        if "namespace" in doc["metadata"]:
            assert doc["metadata"]["namespace"] == "platform"


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_lint_is_clean(values: dict[str, Any]) -> None:
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version="v1.30.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


BAD_VALUES = {
    "negative replicas": ({"webhook": {"replicas": -1}}, "/webhook/replicas"),
    "zero replicas": ({"webhook": {"replicas": 0}}, "/webhook/replicas"),
    "unknown failurePolicy": ({"webhook": {"failurePolicy": "Sometimes"}}, "/webhook/failurePolicy"),
    "timeout above 30 s": ({"webhook": {"timeoutSeconds": 45}}, "/webhook/timeoutSeconds"),
    "misspelt key": ({"webhook": {"replica": 2}}, "replica"),
    "unknown top-level key": ({"certManager": {"enabled": True}}, "certManager"),
    "no secret without cert-manager": ({"tls": {"certManager": {"enabled": False}}}, "/tls/secretName"),
    "caBundle not base64": (
        {"tls": {"certManager": {"enabled": False}, "secretName": "s", "caBundle": "-----BEGIN"}},
        "/tls/caBundle",
    ),
    "pool without price": (
        {"pools": [{"name": "a", "gpu": "L40S", "gpus_per_node": 4, "nodes": 1, "node_selector": {"a": "b"}}]},
        "price_usd_per_gpu_hour",
    ),
    "negative price": (
        {"pools": [{"name": "a", "gpu": "L40S", "gpus_per_node": 4, "nodes": 1, "price_usd_per_gpu_hour": -1,
                    "node_selector": {"a": "b"}}]},
        "/pools/0/price_usd_per_gpu_hour",
    ),
    "unknown pool field": (
        {"pools": [{"name": "a", "gpu": "L40S", "gpus_per_node": 4, "nodes": 1, "price_usd_per_gpu_hour": 1,
                    "node_selector": {"a": "b"}, "price": 1}]},
        "price",
    ),
    "no pools": ({"pools": []}, "/pools"),
    "pool of no nodes": (  # vramfit's pools loader refuses it: the webhook would not start
        {"pools": [{"name": "a", "gpu": "L40S", "gpus_per_node": 4, "nodes": 0, "price_usd_per_gpu_hour": 1,
                    "node_selector": {"a": "b"}}]},
        "/pools/0/nodes"),
    "pool beyond a million nodes": (  # vramfit's pools loader refuses it (scheduler.pools.MAX_NODES)
        {"pools": [{"name": "a", "gpu": "L40S", "gpus_per_node": 4, "nodes": 10**6 + 1, "price_usd_per_gpu_hour": 1,
                    "node_selector": {"a": "b"}}]},
        "/pools/0/nodes"),
    "more GPUs per node than a node holds": (  # scheduler.pools.MAX_GPUS_PER_NODE
        {"pools": [{"name": "a", "gpu": "L40S", "gpus_per_node": 65, "nodes": 1, "price_usd_per_gpu_hour": 1,
                    "node_selector": {"a": "b"}}]},
        "/pools/0/gpus_per_node"),
    "free pool": (
        {"pools": [{"name": "a", "gpu": "L40S", "gpus_per_node": 4, "nodes": 1, "price_usd_per_gpu_hour": 0,
                    "node_selector": {"a": "b"}}]},
        "/pools/0/price_usd_per_gpu_hour"),
    "toleration Equal without a key": (
        {"pools": [{"name": "a", "gpu": "L40S", "gpus_per_node": 4, "nodes": 1, "price_usd_per_gpu_hour": 1,
                    "node_selector": {"a": "b"}, "tolerations": [{"operator": "Equal", "value": "x"}]}]},
        "/pools/0/tolerations/0"),
    "toleration Exists with a value": (
        {"pools": [{"name": "a", "gpu": "L40S", "gpus_per_node": 4, "nodes": 1, "price_usd_per_gpu_hour": 1,
                    "node_selector": {"a": "b"}, "tolerations": [{"key": "k", "operator": "Exists", "value": "x"}]}]},
        "/pools/0/tolerations/0"),
    "toleration field the pools file lacks": (
        {"pools": [{"name": "a", "gpu": "L40S", "gpus_per_node": 4, "nodes": 1, "price_usd_per_gpu_hour": 1,
                    "node_selector": {"a": "b"}, "tolerations": [{"key": "k", "tolerationSeconds": 5}]}]},
        "tolerationSeconds"),
    "headroom of 1": ({"headroomFraction": 1}, "/headroomFraction"),
    "bad anti-affinity mode": ({"webhook": {"podAntiAffinity": "strict"}}, "/webhook/podAntiAffinity"),
    "bad Kueue label key": ({"kueue": {"enabled": True, "flavorLabelKey": "not a key"}}, "/kueue/flavorLabelKey"),
    "bad scrape interval": ({"serviceMonitor": {"interval": "thirty seconds"}}, "/serviceMonitor/interval"),
    "privileged collector port": ({"collector": {"port": 80}}, "/collector/port"),
    "old collector metrics key": ({"collector": {"metrics": {"enabled": True}}}, "metrics"),
    "model without a volume": ({"residualModels": {"vramModel": "vram.skops"}}, "/residualModels/volume"),
    "model path leaving the volume": ({"residualModels": {"volume": {"emptyDir": {}}, "runtimeModel": "../rt.skops"}},
                                      "/residualModels/runtimeModel"),
    "absolute model path": ({"residualModels": {"volume": {"emptyDir": {}}, "vramModel": "/models/v.skops"}},
                            "/residualModels/vramModel"),
}


@pytest.mark.parametrize(("values", "where"), BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_schema_rejects_bad_values(chart: Any, values: dict[str, Any], where: str) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        chart.render(values, name="vramfit", namespace=NAMESPACE)
    assert where in str(caught.value)


def test_schema_accepts_the_defaults_and_every_value_set(chart: Any) -> None:
    for values in VALUE_SETS.values():
        chart.validate_schema(chart.merge_values(values))


def test_defaults_render_the_same_installation_as_deploy(chart: Any) -> None:
    """With release `vramfit` in `vramfit-system`, the chart and deploy/ agree field by field."""
    rendered = render(chart, {})
    plain = [doc for path in sorted(DEPLOY.glob("*.yaml")) for doc in load_documents(path.read_text())]
    assert {(d["kind"], d["metadata"]["name"]) for d in rendered} == {
        (d["kind"], d["metadata"]["name"]) for d in plain if d["kind"] != "Namespace"
    }
    by_key = {(d["kind"], d["metadata"]["name"]): d for d in plain}
    for doc in rendered:
        twin = by_key[(doc["kind"], doc["metadata"]["name"])]
        if doc["kind"] in ("Deployment",):
            assert doc["spec"]["template"]["spec"]["containers"] == twin["spec"]["template"]["spec"]["containers"]
            assert doc["spec"]["template"]["spec"]["volumes"] == twin["spec"]["template"]["spec"]["volumes"]
            assert doc["spec"]["strategy"] == twin["spec"]["strategy"]
        elif doc["kind"].endswith("WebhookConfiguration"):
            assert doc["webhooks"] == twin["webhooks"]
            assert doc["metadata"]["annotations"] == twin["metadata"]["annotations"]
        elif doc["kind"] == "ConfigMap":
            assert yaml.safe_load(doc["data"]["pools.yaml"]) == yaml.safe_load(twin["data"]["pools.yaml"])
        elif doc["kind"] in ("Certificate", "Issuer", "PersistentVolumeClaim", "ClusterRole"):
            assert doc.get("spec", doc.get("rules")) == twin.get("spec", twin.get("rules"))


def test_failure_policy_reaches_both_webhooks(chart: Any) -> None:
    for policy in ("Fail", "Ignore"):
        docs = render(chart, {"webhook": {"failurePolicy": policy}})
        hooks = [h for d in docs if d["kind"].endswith("WebhookConfiguration") for h in d["webhooks"]]
        assert [h["failurePolicy"] for h in hooks] == [policy, policy]
        assert all(h["sideEffects"] == "NoneOnDryRun" and h["timeoutSeconds"] == 5 for h in hooks)
        assert policy in notes(chart, {"webhook": {"failurePolicy": policy}})


def test_provided_secret_replaces_cert_manager(chart: Any) -> None:
    docs = render(chart, PROVIDED_SECRET)
    assert not {"Issuer", "Certificate"} & set(kinds(docs))
    for doc in docs:
        if doc["kind"].endswith("WebhookConfiguration"):
            assert "annotations" not in doc["metadata"]
            assert doc["webhooks"][0]["clientConfig"]["caBundle"] == FAKE_CA
    tls = next(v for v in webhook_deployment(docs)["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
    assert tls["secret"]["secretName"] == "my-webhook-tls"


def test_cert_manager_chain(chart: Any) -> None:
    docs = render(chart, {})
    issuers = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "Issuer"}
    certs = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "Certificate"}
    assert issuers == {"vramfit-selfsigned": {"selfSigned": {}}, "vramfit-ca": {"ca": {"secretName": "vramfit-ca"}}}
    assert certs["vramfit-ca"]["isCA"] is True
    assert certs["vramfit-ca"]["issuerRef"]["name"] == "vramfit-selfsigned"
    assert certs["vramfit-webhook"]["issuerRef"]["name"] == "vramfit-ca"
    assert "vramfit-webhook.vramfit-system.svc" in certs["vramfit-webhook"]["dnsNames"]


@pytest.mark.parametrize("enabled", [False, True])
def test_monitoring_toggles(chart: Any, enabled: bool) -> None:
    values = {
        "serviceMonitor": {"enabled": enabled},
        "prometheusRule": {"enabled": enabled},
        "grafanaDashboard": {"enabled": enabled},
    }
    present = set(kinds(render(chart, values)))
    assert ("ServiceMonitor" in present) is enabled
    assert ("PrometheusRule" in present) is enabled
    dashboards = [d for d in render(chart, values) if d["kind"] == "ConfigMap" and "dashboard" in d["metadata"]["name"]]
    assert len(dashboards) == (1 if enabled else 0)


def test_service_monitor_tls(chart: Any) -> None:
    def endpoint(values: dict[str, Any]) -> dict[str, Any]:
        monitors = [d for d in render(chart, values) if d["kind"] == "ServiceMonitor"]
        return next(m for m in monitors if m["metadata"]["name"].endswith("-webhook"))["spec"]["endpoints"][0]

    with_ca = endpoint(MONITORING_ON)
    assert with_ca["scheme"] == "https"
    assert with_ca["tlsConfig"]["ca"]["secret"] == {"name": "vramfit-webhook-tls", "key": "ca.crt"}
    assert with_ca["tlsConfig"]["serverName"] == "vramfit-webhook.vramfit-system.svc"
    assert endpoint({**MONITORING_ON, **PROVIDED_SECRET})["tlsConfig"]["insecureSkipVerify"] is True
    custom = {"serviceMonitor": {"enabled": True, "tlsConfig": {"insecureSkipVerify": False, "serverName": "x"}}}
    assert endpoint(custom)["tlsConfig"] == {"insecureSkipVerify": False, "serverName": "x"}


def test_prometheus_rule_carries_the_rule_file(chart: Any) -> None:
    plain = DEPLOY / "prometheus" / "vramfit-rules.yaml"
    assert (CHART / "rules" / "vramfit-rules.yaml").read_bytes() == plain.read_bytes(), (
        "charts/vramfit/rules/vramfit-rules.yaml must be a copy of deploy/prometheus/vramfit-rules.yaml"
    )
    rule = only(render(chart, {"prometheusRule": {"enabled": True, "labels": {"release": "prom"}}}), "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(plain.read_text())
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert "{{ $value | humanizePercentage }}" in rule["spec"]["groups"][0]["rules"][0]["annotations"]["description"]


def test_dashboard_configmap_carries_the_dashboard(chart: Any) -> None:
    plain = DEPLOY / "grafana" / "vramfit-dashboard.json"
    assert (CHART / "dashboards" / "vramfit-dashboard.json").read_bytes() == plain.read_bytes(), (
        "charts/vramfit/dashboards/vramfit-dashboard.json must be a copy of deploy/grafana/vramfit-dashboard.json"
    )
    values = {"grafanaDashboard": {"enabled": True, "namespace": "monitoring"}}
    configmap = next(d for d in render(chart, values) if d["metadata"]["name"] == "vramfit-dashboard")
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["vramfit-dashboard.json"]) == json.loads(plain.read_text())


def serve_args(docs: list[Manifest]) -> list[str]:
    return webhook_deployment(docs)["spec"]["template"]["spec"]["containers"][0]["args"]


def test_kueue_flavor_label(chart: Any) -> None:
    assert not any(a.startswith("--kueue-flavor-label") for a in serve_args(render(chart, {})))
    assert "--kueue-flavor-label=vramfit.io/pool" in serve_args(render(chart, {"kueue": {"enabled": True}}))
    custom = {"kueue": {"enabled": True, "flavorLabelKey": "example.com/pool"}}
    assert "--kueue-flavor-label=example.com/pool" in serve_args(render(chart, custom))
    assert "example.com/pool: l40s" in notes(chart, custom)


def test_webhook_is_stateless_and_collector_is_the_single_writer(chart: Any) -> None:
    docs = render(chart, {})
    webhook = webhook_deployment(docs)
    assert webhook["spec"]["replicas"] == 2
    # No ledger of its own: the decisions go to the collector (--ledger-url), the single writer.
    assert not any(a.startswith("--ledger=") for a in serve_args(docs))
    assert all("persistentVolumeClaim" not in v for v in webhook["spec"]["template"]["spec"]["volumes"])
    collector = next(d for d in docs if d["kind"] == "Deployment" and d is not webhook)
    assert collector["spec"]["replicas"] == 1
    assert collector["spec"]["strategy"] == {"type": "Recreate"}
    args = collector["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args == ["collect", "--ledger=/var/lib/vramfit/ledger.sqlite", "--serve-host=0.0.0.0", "--serve-port=8080",
                    "--prune-unjoined-days=90", "--kube"]
    assert only(docs, "PersistentVolumeClaim")["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_collector_prunes_unjoined_records_unless_told_not_to(chart: Any) -> None:
    def collector_args(values: dict[str, Any]) -> list[str]:
        docs = render(chart, values)
        collector = next(d for d in docs if d["kind"] == "Deployment" and d is not webhook_deployment(docs))
        return collector["spec"]["template"]["spec"]["containers"][0]["args"]

    assert "--prune-unjoined-days=30" in collector_args({"collector": {"pruneUnjoinedDays": 30}})
    assert not any(a.startswith("--prune") for a in collector_args({"collector": {"pruneUnjoinedDays": 0}}))


def collector_deployment(docs: list[Manifest]) -> Manifest:
    return next(d for d in docs if d["kind"] == "Deployment" and d is not webhook_deployment(docs))


def test_collector_sources_follow_the_values(chart: Any) -> None:
    def args(values: dict[str, Any]) -> list[str]:
        return collector_deployment(render(chart, values))["spec"]["template"]["spec"]["containers"][0]["args"]

    assert "--kube" in args({}) and not any(a.startswith("--prometheus-url") for a in args({}))
    assert "--kube" not in args({"collector": {"kube": {"enabled": False}}})
    assert "--namespace=ml" in args({"collector": {"kube": {"namespace": "ml"}}})
    url = "http://prometheus-operated.monitoring:9090"
    assert f"--prometheus-url={url}" in args({"collector": {"prometheusUrl": url}})


def test_ledger_token_is_required_by_the_collector_and_sent_by_the_webhook(chart: Any) -> None:
    docs = render(chart, {})
    assert not any("token" in a for a in serve_args(docs))
    collector = collector_deployment(docs)["spec"]["template"]["spec"]["containers"][0]
    assert not any("token" in a for a in collector["args"])
    docs = render(chart, {"ledgerAuth": {"existingSecret": "ledger-token", "key": "bearer"}})
    path = "/var/run/vramfit/ledger-token/bearer"
    for deployment, flag in ((webhook_deployment(docs), "--ledger-token-file"),
                             (collector_deployment(docs), "--token-file")):
        pod = deployment["spec"]["template"]["spec"]
        assert f"{flag}={path}" in pod["containers"][0]["args"]
        assert {"name": "ledger-token", "secret": {"secretName": "ledger-token"}} in pod["volumes"]
        assert {"name": "ledger-token", "mountPath": "/var/run/vramfit/ledger-token", "readOnly": True} in pod[
            "containers"][0]["volumeMounts"]


def test_webhook_forwards_decisions_to_the_collector_service(chart: Any) -> None:
    docs = render(chart, {}, name="gpu-sched", namespace="platform")
    assert "--ledger-url=http://gpu-sched-vramfit-collector.platform.svc:8080" in serve_args(docs)
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].endswith("-collector"))
    assert service["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]
    moved = render(chart, {"collector": {"port": 9090}})
    assert "--ledger-url=http://vramfit-collector.vramfit-system.svc:9090" in serve_args(moved)
    assert cross_reference_problems(moved, NAMESPACE) == []
    # Without a collector there is no ledger to forward to: the replicas only count their decisions.
    alone = render(chart, {"collector": {"enabled": False}})
    assert not any(a.startswith("--ledger") for a in serve_args(alone))
    assert [d["metadata"]["name"] for d in alone if d["kind"] == "Service"] == ["vramfit-webhook"]


def test_collector_probes_its_health_endpoints(chart: Any) -> None:
    collector = next(d for d in render(chart, {}) if d["metadata"]["name"] == "vramfit-collector"
                     and d["kind"] == "Deployment")
    [container] = collector["spec"]["template"]["spec"]["containers"]
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http", "scheme": "HTTP"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http", "scheme": "HTTP"}
    assert "pools" not in {v["name"] for v in collector["spec"]["template"]["spec"]["volumes"]}


def test_collector_service_monitor_scrapes_port_http(chart: Any) -> None:
    def monitors(values: dict[str, Any]) -> dict[str, Any]:
        return {d["metadata"]["name"]: d["spec"] for d in render(chart, values) if d["kind"] == "ServiceMonitor"}

    on = monitors({"serviceMonitor": {"enabled": True}})
    assert set(on) == {"vramfit-webhook", "vramfit-collector"}
    assert on["vramfit-collector"]["endpoints"][0] | {"interval": None, "scrapeTimeout": None} == {
        "port": "http", "path": "/metrics", "scheme": "http", "interval": None, "scrapeTimeout": None}
    assert set(monitors({"serviceMonitor": {"enabled": True}, "collector": {"serviceMonitor": {"enabled": False}}})) \
        == {"vramfit-webhook"}
    assert set(monitors({"serviceMonitor": {"enabled": True}, "collector": {"enabled": False}})) == {"vramfit-webhook"}


def test_replicas_spread_and_disruption_budget(chart: Any) -> None:
    docs = render(chart, {"webhook": {"replicas": 3}})
    affinity = webhook_deployment(docs)["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" in affinity
    assert only(docs, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    single = render(chart, {"webhook": {"replicas": 1, "podAntiAffinity": "hard"}})
    assert "PodDisruptionBudget" not in kinds(single)
    affinity = webhook_deployment(single)["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" in affinity


def test_changing_pools_rolls_the_pods(chart: Any) -> None:
    def checksum(values: dict[str, Any]) -> str:
        template = webhook_deployment(render(chart, values))["spec"]["template"]
        return template["metadata"]["annotations"]["checksum/pools"]

    assert checksum({}) == checksum({"webhook": {"replicas": 4}})
    assert checksum({}) != checksum({"headroomFraction": 0.1})


def test_namespace_selection(chart: Any) -> None:
    def expressions(values: dict[str, Any], namespace: str = NAMESPACE) -> list[dict[str, Any]]:
        docs = render(chart, values, namespace=namespace)
        return only(docs, "MutatingWebhookConfiguration")["webhooks"][0]["namespaceSelector"]["matchExpressions"]

    assert expressions({}) == [
        {"key": "vramfit.io/enabled", "operator": "In", "values": ["true"]},
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
         "values": ["vramfit-system", "kube-system", "cert-manager"]},
    ]
    custom = {"webhook": {"namespaceSelector": {"labelKey": "example.com/gpu-placement", "labelValue": "on"}}}
    assert expressions(custom)[0] == {"key": "example.com/gpu-placement", "operator": "In", "values": ["on"]}
    everywhere = {"webhook": {"namespaceSelector": {"optIn": False, "excludeNamespaces": ["kube-system", "ops"]}}}
    assert expressions(everywhere, namespace="ops") == [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["ops", "kube-system"]}
    ]


def test_match_conditions(chart: Any) -> None:
    hook = only(render(chart, {}), "ValidatingWebhookConfiguration")["webhooks"][0]
    assert [c["name"] for c in hook["matchConditions"]] == ["pods-requesting-gpus", "batch-jobs-requesting-gpus",
                                                            "not-a-controllers-pod", "not-a-job-of-a-placed-jobset"]
    shipped = load_documents((Path(__file__).resolve().parents[2] / "deploy" / "60-webhooks.yaml").read_text())
    assert hook["matchConditions"] == next(d for d in shipped if d["kind"] == "ValidatingWebhookConfiguration")[
        "webhooks"][0]["matchConditions"]  # the chart and deploy/ send the webhook the same objects
    amd = {"webhook": {"matchConditions": {"gpuResourceName": "amd.com/gpu"}}}
    hook = only(render(chart, amd), "ValidatingWebhookConfiguration")["webhooks"][0]
    assert all("'amd.com/gpu' in c.resources.limits" in c["expression"] for c in hook["matchConditions"][:2])
    off = {"webhook": {"matchConditions": {"enabled": False}}}
    assert "matchConditions" not in only(render(chart, off), "ValidatingWebhookConfiguration")["webhooks"][0]


def test_image_tag_defaults_to_app_version(chart: Any) -> None:
    image = webhook_deployment(render(chart, {}))["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"ghcr.io/vramfit/vramfit:{chart.metadata['appVersion']}"
    pinned = {"image": {"tag": "0.2.0-rc1"}}
    assert webhook_deployment(render(chart, pinned))["spec"]["template"]["spec"]["containers"][0]["image"].endswith(
        ":0.2.0-rc1"
    )


def leaf_paths(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in ("resources", "labels", "podSecurityContext",
                                                             "securityContext"):
            yield from leaf_paths(value, path + ".")
        else:
            yield path


def test_readme_documents_every_value(chart: Any) -> None:
    readme = (CHART / "README.md").read_text()
    missing = [path for path in leaf_paths(chart.values) if f"`{path}`" not in readme]
    assert missing == []


def test_cluster_models_reach_the_webhook(chart: Any) -> None:
    """residualModels: the volume is mounted read-only and each named model reaches `vramfit serve` as the
    environment variable predict/place/serve load it from; without them the container has no env at all."""
    values = VALUE_SETS["cluster-models"]
    pod = webhook_deployment(render(chart, values))["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert {e["name"]: e["value"] for e in container["env"]} == {
        "VRAMFIT_RESIDUAL_MODEL": "/var/lib/vramfit/models/site/vram.skops",
        "VRAMFIT_RUNTIME_RESIDUAL_MODEL": "/var/lib/vramfit/models/runtime.skops",
    }
    mount = next(m for m in container["volumeMounts"] if m["name"] == "residual-models")
    assert mount == {"name": "residual-models", "mountPath": "/var/lib/vramfit/models", "readOnly": True}
    volume = next(v for v in pod["volumes"] if v["name"] == "residual-models")
    assert volume == {"name": "residual-models",
                      "persistentVolumeClaim": {"claimName": "vramfit-models", "readOnly": True}}
    only_runtime = {"residualModels": {"volume": {"emptyDir": {}}, "runtimeModel": "rt.skops"}}
    env = webhook_deployment(render(chart, only_runtime))["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e["name"] for e in env] == ["VRAMFIT_RUNTIME_RESIDUAL_MODEL"]
    plain = webhook_deployment(render(chart, {}))["spec"]["template"]["spec"]
    assert "env" not in plain["containers"][0]
    assert "residual-models" not in {v["name"] for v in plain["volumes"]}
