"""The NetworkPolicies (chart networkPolicy.enabled, deploy/network/): who reaches the webhook and the collector.

Each scenario evaluates the rendered policies' ingress rules (tests/deploy/network_policy.py) against the pods the
same rendering runs, so a label or port renamed in one template but not the other fails here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.manifests import Manifest, assert_valid, load_documents, webhook_deployment
from tests.deploy.network_policy import Endpoint, allows, namespace, pod_of, selector_matches

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (the Helm engine) is not installed")

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "vramfit"
DEPLOY = REPO / "deploy"
RELEASE_NS = "vramfit-system"

OPTED_IN = namespace("team-a", **{"vramfit.io/enabled": "true"})
NOT_OPTED_IN = namespace("team-b")
MONITORING = namespace("monitoring")
API_SERVER = Endpoint(None)  # the control plane: no pod, no namespace


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render(chart: Any, values: dict[str, Any]) -> list[Manifest]:
    rendered = chart.render(values, name="vramfit", namespace=RELEASE_NS)
    return [doc for path, text in sorted(rendered.items()) if path.endswith(".yaml") for doc in load_documents(text)]


def pods(docs: list[Manifest]) -> tuple[Endpoint, Endpoint]:
    webhook = webhook_deployment(docs)
    collector = next(d for d in docs if d["kind"] == "Deployment" and d is not webhook)
    release = namespace(RELEASE_NS)
    return pod_of(webhook, release), pod_of(collector, release)


def some_pod(ns_labels: dict[str, str], **labels: str) -> Endpoint:
    return Endpoint(ns_labels["kubernetes.io/metadata.name"], dict(labels), ns_labels)


def policies(docs: list[Manifest]) -> list[Manifest]:
    return [d for d in docs if d["kind"] == "NetworkPolicy"]


def test_off_by_default(chart: Any) -> None:
    assert policies(render(chart, {})) == []


def check_installation(docs: list[Manifest], *, opted_in_only: bool) -> None:
    """The same expectations for the chart's rendering and for deploy/ with deploy/network/."""
    rules = policies(docs)
    webhook, collector = pods(docs)
    assert len(rules) == 2
    # Every policy selects exactly one of the two components.
    for rule in rules:
        selected = [p for p in (webhook, collector) if selector_matches(rule["spec"]["podSelector"], p.labels)]
        assert len(selected) == 1, rule["metadata"]["name"]

    # The webhook: the API server (and Prometheus) on the HTTPS port; nothing on any other port.
    assert allows(rules, API_SERVER, webhook, "https")
    assert allows(rules, some_pod(MONITORING, app="prometheus"), webhook, "https")
    assert not allows(rules, API_SERVER, webhook, 9090)

    # The collector: the webhook replicas post decisions, reporters in reviewed namespaces post actuals,
    # Prometheus scrapes /metrics; all on its one port.
    assert allows(rules, webhook, collector, "http")
    assert allows(rules, some_pod(OPTED_IN, job="llama-lora"), collector, "http")
    assert allows(rules, some_pod(MONITORING, app="prometheus"), collector, "http")
    assert allows(rules, some_pod(NOT_OPTED_IN, job="x"), collector, "http") is (not opted_in_only)
    assert not allows(rules, webhook, collector, 9999)
    assert not allows(rules, API_SERVER, collector, "http")
    # Another pod of the release namespace is not the webhook.
    assert not allows(rules, some_pod(namespace(RELEASE_NS), app="debug"), collector, "http")
    assert not allows(rules, some_pod(namespace("kube-system"), app="x"), collector, "http")


def test_chart_policies_let_in_what_the_installation_needs(chart: Any) -> None:
    docs = render(chart, {"networkPolicy": {"enabled": True}})
    assert_valid(policies(docs))
    check_installation(docs, opted_in_only=True)


def test_deploy_network_policies_match_the_plain_manifests() -> None:
    plain = [doc for path in sorted(DEPLOY.glob("*.yaml")) for doc in load_documents(path.read_text())]
    network = load_documents((DEPLOY / "network" / "networkpolicy.yaml").read_text())
    assert_valid(network)
    check_installation(plain + network, opted_in_only=True)


def test_deploy_network_policies_are_the_chart_defaults(chart: Any) -> None:
    """deploy/network/ says what the chart renders, labels aside (deploy/ carries no Helm instance label)."""
    def essence(doc: Manifest) -> tuple[str, list[Any]]:
        ingress = [{**rule, "from": [{k: v for k, v in peer.items() if k != "podSelector"}
                                     if "namespaceSelector" in peer else {"podSelector": "component"}
                                     for peer in rule.get("from", [])]}
                   for rule in doc["spec"]["ingress"]]
        return doc["metadata"]["name"], ingress

    rendered = sorted(essence(d) for d in policies(render(chart, {"networkPolicy": {"enabled": True}})))
    plain = sorted(essence(d) for d in load_documents((DEPLOY / "network" / "networkpolicy.yaml").read_text()))
    assert rendered == plain


def test_without_opt_in_every_reviewed_namespace_reaches_the_collector(chart: Any) -> None:
    docs = render(chart, {"networkPolicy": {"enabled": True},
                          "webhook": {"namespaceSelector": {"optIn": False}}})
    check_installation(docs, opted_in_only=False)
    _, collector = pods(docs)
    for excluded in ("cert-manager", "kube-system"):
        assert not allows(policies(docs), some_pod(namespace(excluded)), collector, "http")


def test_other_opt_in_label_and_collector_port(chart: Any) -> None:
    docs = render(chart, {
        "networkPolicy": {"enabled": True, "collector": {"extraFrom": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
             "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]}},
        "webhook": {"namespaceSelector": {"labelKey": "example.com/gpu-jobs", "labelValue": "yes"}},
        "collector": {"port": 9091},
    })
    assert_valid(policies(docs))
    webhook, collector = pods(docs)
    rules = policies(docs)
    assert collector.container_ports["http"] == 9091
    assert allows(rules, webhook, collector, 9091)
    assert allows(rules, some_pod(namespace("ml", **{"example.com/gpu-jobs": "yes"})), collector, 9091)
    assert not allows(rules, some_pod(OPTED_IN), collector, 9091)  # the default label no longer counts
    observability = namespace("observability")
    assert allows(rules, some_pod(observability, **{"app.kubernetes.io/name": "prometheus"}), collector, 9091)
    assert not allows(rules, some_pod(observability, app="grafana"), collector, 9091)
    assert not allows(rules, some_pod(MONITORING), collector, 9091)  # extraFrom replaced the default


def test_no_collector_no_collector_policy(chart: Any) -> None:
    docs = render(chart, {"networkPolicy": {"enabled": True}, "collector": {"enabled": False}})
    assert [d["metadata"]["name"] for d in policies(docs)] == ["vramfit-webhook"]


@pytest.mark.parametrize("peer", [{}, {"podSelector": {}, "bogus": 1}, {"ipBlock": {}}])
def test_schema_rejects_bad_extra_peers(chart: Any, peer: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        chart.render({"networkPolicy": {"enabled": True, "collector": {"extraFrom": [peer]}}},
                     name="vramfit", namespace=RELEASE_NS)
    assert "extraFrom" in str(caught.value)


def test_the_evaluator_denies_what_a_policy_does_not_allow() -> None:
    """The evaluator itself: an empty ingress list denies everything; no policy allows everything."""
    target = Endpoint("ns", {"app": "x"}, namespace("ns"), {"http": 80})
    deny_all = {"kind": "NetworkPolicy", "metadata": {"namespace": "ns"},
                "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": []}}
    assert allows([], API_SERVER, target, 80)
    assert not allows([deny_all], some_pod(namespace("ns")), target, 80)
    egress_only = {**deny_all, "spec": {**deny_all["spec"], "policyTypes": ["Egress"]}}
    assert allows([egress_only], some_pod(namespace("ns")), target, 80)
    in_expression = {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]}
    assert selector_matches(in_expression, {"tier": "a"}) and not selector_matches(in_expression, {})
