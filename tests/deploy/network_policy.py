"""Who may connect to whom under a set of NetworkPolicies: the ingress rules of the Kubernetes API, evaluated.

There is no CNI on the test machines, so the chart's and deploy/'s policies are checked by evaluating their
ingress semantics (networking.k8s.io/v1, https://kubernetes.io/docs/concepts/services-networking/network-policies/):

- a pod that no Ingress policy of its namespace selects accepts every connection;
- otherwise a connection is allowed when some rule of some selecting policy allows it: the rule's ``from``
  peers (missing or empty: any source) and its ``ports`` (missing or empty: any port) both match;
- a peer with only ``podSelector`` selects pods in the policy's own namespace; with only ``namespaceSelector``,
  every pod of the matching namespaces; with both, the matching pods of the matching namespaces;
- a named port matches the target container port of that name; a number matches the container port number.

Sources outside the cluster's pods (the API server calling a webhook) have no namespace and no labels: only
rules without ``from`` (or with an ``ipBlock``, which this evaluator does not model) let them in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

Manifest = dict[str, Any]


@dataclass(frozen=True)
class Endpoint:
    """A pod (namespace, its labels, its namespace's labels) or, with namespace None, a source outside the pods."""

    namespace: str | None
    labels: dict[str, str] = field(default_factory=dict)
    namespace_labels: dict[str, str] = field(default_factory=dict)
    container_ports: dict[str, int] = field(default_factory=dict)  # name -> number, for a target pod


def namespace(name: str, **labels: str) -> dict[str, str]:
    """A namespace's labels, with the kubernetes.io/metadata.name label every namespace carries (1.21+)."""
    return {"kubernetes.io/metadata.name": name, **labels}


def selector_matches(selector: Manifest | None, labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions); an empty selector matches everything."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise ValueError(f"unknown selector operator {operator!r}")
    return True


def _peer_matches(peer: Manifest, policy_namespace: str, source: Endpoint) -> bool:
    if source.namespace is None:
        return False  # ipBlock peers are not modelled: outside sources match no selector
    if "ipBlock" in peer:
        return False
    pods, namespaces = peer.get("podSelector"), peer.get("namespaceSelector")
    if namespaces is None:
        return source.namespace == policy_namespace and selector_matches(pods, source.labels)
    if not selector_matches(namespaces, source.namespace_labels):
        return False
    return pods is None or selector_matches(pods, source.labels)


def _port_matches(ports: list[Manifest] | None, port: int | str, target: Endpoint) -> bool:
    if not ports:
        return True
    number = port if isinstance(port, int) else target.container_ports.get(port)
    for rule_port in ports:
        if rule_port.get("protocol", "TCP") != "TCP":
            continue
        wanted = rule_port.get("port")
        if wanted is None:
            return True
        wanted_number = wanted if isinstance(wanted, int) else target.container_ports.get(wanted)
        if wanted_number is not None and wanted_number == number:
            return True
    return False


def allows(policies: Iterable[Manifest], source: Endpoint, target: Endpoint, port: int | str) -> bool:
    """Whether a TCP connection from source to target's port is allowed."""
    selecting = [
        p for p in policies
        if p["kind"] == "NetworkPolicy"
        and p["metadata"]["namespace"] == target.namespace
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
        and selector_matches(p["spec"]["podSelector"], target.labels)
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress") or []:
            peers = rule.get("from")
            from_ok = not peers or any(
                _peer_matches(peer, policy["metadata"]["namespace"], source) for peer in peers)
            if from_ok and _port_matches(rule.get("ports"), port, target):
                return True
    return False


def pod_of(deployment: Manifest, namespace_labels: dict[str, str]) -> Endpoint:
    """The pod a Deployment runs: its template's labels and the first container's named ports."""
    template = deployment["spec"]["template"]
    ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0].get("ports", []) if "name" in p}
    return Endpoint(deployment["metadata"]["namespace"], dict(template["metadata"]["labels"]),
                    namespace_labels, ports)
