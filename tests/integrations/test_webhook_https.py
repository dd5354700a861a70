"""The real webhook server over HTTPS on 127.0.0.1: certificates made here, AdmissionReviews built from
the shared fixtures and the example jobs, patches applied with jsonpatch and the results checked
against the Kubernetes schemas (kubernetes-validate) or, for CRDs, their pod-spec structure."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

httpx = pytest.importorskip("httpx")
kubernetes_validate = pytest.importorskip("kubernetes_validate")
pytest.importorskip("uvicorn")
pytest.importorskip("cryptography")

from cryptography.hazmat.primitives.serialization import Encoding  # noqa: E402

from tests.integrations.certs import Authority, make_ca, write_server_pair  # noqa: E402
from tests.integrations.manifests import (  # noqa: E402
    ALIAS_BOMB,
    KINDS,
    REPO,
    SPEC_70B_ONE_GPU,
    admission_review,
    apply,
    fixtures_dir,
    patch_ops,
)
from tests.integrations.processes import wait_until  # noqa: E402
from tests.integrations.serving import free_port, ready, start_webhook, stop  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.integration]

POOLS_YAML = """
pools:
  - {name: l40s, gpu: L40S, gpus_per_node: 8, nodes: 4, price_usd_per_gpu_hour: 1.45,
     node_selector: {nvidia.com/gpu.product: NVIDIA-L40S},
     tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]}
  - {name: h100, gpu: H100-80GB, gpus_per_node: 8, nodes: 4, price_usd_per_gpu_hour: 2.99,
     node_selector: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3},
     tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]}
  - {name: b200, gpu: B200, gpus_per_node: 8, nodes: 2, price_usd_per_gpu_hour: 4.99,
     node_selector: {nvidia.com/gpu.product: NVIDIA-B200}}
"""
BUILT_IN = {("v1", "Pod"), ("batch/v1", "Job")}  # validated against the Kubernetes schemas
POD_SPEC_KEYS = {"containers", "nodeSelector", "tolerations", "restartPolicy", "initContainers", "volumes",
                 "affinity", "serviceAccountName", "schedulerName", "hostIPC", "hostNetwork", "dnsPolicy",
                 "imagePullSecrets", "securityContext", "terminationGracePeriodSeconds", "priorityClassName"}


class Server:
    def __init__(self, port: int, ca: Authority, cert_dir: Path, log_path: Path, process: subprocess.Popen) -> None:
        self.port = port
        self.ca = ca
        self.cert_dir = cert_dir
        self.log_path = log_path
        self.process = process
        self.ca_file = cert_dir / "ca.crt"

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def client(self) -> Any:
        return httpx.Client(base_url=self.url, verify=ssl.create_default_context(cafile=str(self.ca_file)),
                            timeout=10.0)

    def peer_certificate(self) -> bytes:
        """DER of the certificate the server presents to a new connection."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            der = tls.getpeercert(binary_form=True)
        assert der is not None
        return der


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("webhook")
    ca = make_ca()
    (directory / "ca.crt").write_bytes(ca.pem())
    write_server_pair(ca, directory)
    (directory / "pools.yaml").write_text(POOLS_YAML)
    port = free_port()
    process, log_path = start_webhook(directory, port, ["--pools", str(directory / "pools.yaml"),
                                                        "--tls-reload-seconds", "0.2"])
    srv = Server(port, ca, directory, log_path, process)
    try:
        verify = ssl.create_default_context(cafile=str(srv.ca_file))
        wait_until(lambda: ready(srv.url, process, log_path, verify=verify), 60, "the webhook's /readyz")
        yield srv
    finally:
        stop(process)


def _example_objects() -> list[tuple[str, dict[str, Any]]]:
    """Every job of examples/jobs, the kinds table, and every shared fixture object (first document)."""
    out = []
    for path in sorted((REPO / "examples" / "jobs").glob("*.yaml")):
        out.append((path.name, next(d for d in yaml.safe_load_all(path.read_text()) if d)))
    for kind, (build, _, _) in KINDS.items():
        out.append((f"table-{kind}", build()))
    return out


def _fixture_objects() -> list[tuple[str, dict[str, Any]]]:
    try:
        directory = fixtures_dir()
    except pytest.skip.Exception:
        return []
    return [(p.name, next(d for d in yaml.safe_load_all(p.read_text()) if d)) for p in sorted(directory.glob("*.yaml"))]


def _check_pod_spec(spec: Any, where: str) -> None:
    """The shape the API server's OpenAPI schema asks of the fields vramfit writes into a pod spec."""
    assert isinstance(spec, dict), where
    assert isinstance(spec.get("containers"), list) and spec["containers"], where
    selector = spec.get("nodeSelector", {})
    assert isinstance(selector, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in selector.items())
    for t in spec.get("tolerations", []):
        assert set(t) <= {"key", "operator", "value", "effect", "tolerationSeconds"}, where
        assert t.get("operator", "Equal") in ("Equal", "Exists"), where
    for c in spec["containers"]:
        for section in ("limits", "requests"):
            for value in ((c.get("resources") or {}).get(section) or {}).values():
                assert isinstance(value, str | int), where


def _pod_templates(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every pod template a custom resource carries, with its pointer: a ``template`` whose ``spec`` is a PodSpec
    (PyTorchJob, JobSet, RayJob, RayCluster, Volcano Job, a TrainJob's runtimePatches), and a TrainJob
    podTemplateOverride (``targetJobs`` beside a PodSpec ``spec``)."""
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        spec = node.get("spec")
        pod_like = isinstance(spec, dict) and bool(set(spec) & POD_SPEC_KEYS)
        if pod_like and (path.endswith("/template") or "targetJobs" in node):
            found.append((path, node))
        for key, value in node.items():
            found += _pod_templates(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _pod_templates(value, f"{path}/{i}")
    return found


def _validate_pod_template(template: dict[str, Any], where: str) -> None:
    """A pod template of a custom resource against the Kubernetes PodTemplate schema (strict). An override carries
    only the fields it changes, so a placeholder container stands in where it has none."""
    spec = dict(template["spec"])
    spec.setdefault("containers", [{"name": "placeholder", "image": "placeholder"}])
    wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "vramfit-check"},
               "template": {"metadata": template.get("metadata") or {}, "spec": spec}}
    try:
        kubernetes_validate.validate(wrapped, kubernetes_validate.utils.latest_version(), strict=True)
    except kubernetes_validate.ValidationError as exc:
        raise AssertionError(f"{where}: {exc}") from exc


def _check(obj: dict[str, Any], patched: dict[str, Any], ops: list[dict[str, Any]]) -> None:
    annotations = patched["metadata"]["annotations"]
    assert all(isinstance(v, str) for v in annotations.values())
    if (obj["apiVersion"], obj["kind"]) in BUILT_IN:
        kubernetes_validate.validate(patched, kubernetes_validate.utils.latest_version(), strict=True)
        return
    templates = _pod_templates(patched)
    assert templates, f"{obj['kind']}: no pod template found to validate"
    for pointer, template in templates:  # CRDs: every pod template, the ones vramfit touched among them
        _validate_pod_template(template, f"{obj['kind']} {pointer}")
        _check_pod_spec({"containers": [{}], **template["spec"]}, f"{obj['kind']} {pointer}")
    pointers = [pointer for pointer, _ in templates]

    def allowed(op: dict[str, Any]) -> bool:
        path = op["path"]
        if path.startswith("/metadata/") or any(path.startswith(p + "/") or path == p for p in pointers):
            return True
        # an ancestor of a pod template only where the patch adds what was not there (a TrainJob's runtimePatches)
        return op["op"] == "add" and any(p.startswith(path + "/") for p in pointers) and not _exists(obj, path)

    outside = {op["path"] for op in ops if not allowed(op)}
    assert not outside, f"{obj['kind']}: patched outside the object's metadata and its pod templates: {outside}"


def _exists(obj: Any, pointer: str) -> bool:
    node = obj
    for part in pointer.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


@pytest.mark.parametrize(("name", "obj"), _example_objects() + _fixture_objects(), ids=lambda v: v
                         if isinstance(v, str) else "")
def test_mutate_over_https_patches_validly_and_idempotently(server: Server, name: str, obj: dict[str, Any]) -> None:
    with server.client() as client:
        reply = client.post("/mutate", json=admission_review(obj, uid=f"uid-{name}"))
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("application/json")
        review = reply.json()
        assert review["response"]["uid"] == f"uid-{name}" and review["response"]["allowed"] is True
        ops = patch_ops(review)
        if not ops:
            return
        patched = apply(obj, ops)
        _check(obj, patched, ops)
        again = client.post("/mutate", json=admission_review(patched, uid=f"again-{name}")).json()
        assert patch_ops(again) == []
        validated = client.post("/validate", json=admission_review(patched, uid=f"val-{name}")).json()
        assert validated["response"]["allowed"] is True and "patch" not in validated["response"]


def test_patches_are_produced_for_every_kind(server: Server) -> None:
    """The loop above may skip objects; make sure the schema check ran on a patched object of every kind, the
    TrainJob's runtimePatches entry included."""
    for kind, (build, _, _) in KINDS.items():
        obj = build()
        with server.client() as client:
            ops = patch_ops(client.post("/mutate", json=admission_review(obj)).json())
        assert ops, kind
        _check(obj, apply(obj, ops), ops)


def test_validate_denies_a_job_that_fits_no_pool(server: Server) -> None:
    obj = KINDS["PyTorchJob"][0](spec=SPEC_70B_ONE_GPU)
    with server.client() as client:
        review = client.post("/validate", json=admission_review(obj, uid="deny-1")).json()["response"]
    assert review["uid"] == "deny-1" and review["allowed"] is False
    assert "fits no node pool" in review["status"]["message"]
    assert all(f"  - {p}: " in review["status"]["message"] for p in ("l40s", "h100", "b200"))


@pytest.mark.parametrize(
    ("annotation", "problem"),
    [
        # Before the alias cap this made the server build a 10**9-node object and be killed for memory.
        ("model: llama-3.1-8b\n" + ALIAS_BOMB, "aliases expand to more than"),
        # Before the size cap pure-Python YAML took about 26 s over this 3 MiB list (the client gives up at 10 s).
        ("model: llama-3.1-8b\nx: [" + "1," * 1_500_000 + "1]\n", "vramfit reads at most 65,536"),
        # PyYAML's composer recurses per level; in the review's worker thread too it ends in a named error.
        ("model: " + "[" * 5000 + "]" * 5000, "nested too deeply"),
    ],
    ids=["alias-bomb", "3MiB-annotation", "deep-nesting"],
)
def test_a_hostile_annotation_is_answered_and_the_server_lives_on(server: Server, annotation: str,
                                                                  problem: str) -> None:
    obj = KINDS["Pod"][0](spec=annotation)
    with server.client() as client:
        for path in ("/mutate", "/validate"):
            review = client.post(path, json=admission_review(obj, uid=f"hostile{path}")).json()["response"]
            assert review["uid"] == f"hostile{path}" and review["allowed"] is True and "patch" not in review
            if path == "/validate":  # the one that names the problem (kubectl shows it once)
                assert problem in review["warnings"][0]
        assert client.get("/healthz").json() == {"status": "ok"}
        assert patch_ops(client.post("/mutate", json=admission_review(KINDS["Pod"][0]())).json())
    assert server.process.poll() is None


def test_large_and_small_reviews_sent_together_are_all_answered(server: Server) -> None:
    """Bodies above LARGE_BODY_BYTES are answered one at a time in a worker thread, small ones beside them."""
    big = KINDS["Pod"][0]()
    big["spec"]["containers"][0]["env"] = [{"name": f"V{i}", "value": "x" * 100} for i in range(3_000)]  # ~0.4 MiB
    bodies = [(f"big-{i}", big) for i in range(3)] + [(f"small-{i}", KINDS["Pod"][0]()) for i in range(6)]
    answers: dict[str, dict[str, Any]] = {}

    def post(uid: str, obj: dict[str, Any]) -> None:
        with server.client() as client:
            answers[uid] = client.post("/mutate", json=admission_review(obj, uid=uid)).json()

    threads = [threading.Thread(target=post, args=pair) for pair in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(answers) == sorted(uid for uid, _ in bodies)
    for uid, answer in answers.items():
        assert answer["response"]["uid"] == uid and answer["response"]["allowed"] is True and patch_ops(answer)
    assert server.process.poll() is None


@pytest.mark.parametrize(
    ("content", "status"),
    [
        (b"{not json", 400),
        (b"\xff\xfe", 400),
        (b"[]", 400),
        (json.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}).encode(), 400),
        (json.dumps({"kind": "Pod", "apiVersion": "v1"}).encode(), 400),
        (b"[" * 5000 + b"]" * 5000, 400),  # deeper than the JSON decoder recurses: an answer, not a crash
    ],
)
def test_malformed_review_gets_http_400(server: Server, content: bytes, status: int) -> None:
    with server.client() as client:
        for path in ("/mutate", "/validate"):
            reply = client.post(path, content=content, headers={"content-type": "application/json"})
            assert reply.status_code == status and "error" in reply.json()


def test_health_and_method(server: Server) -> None:
    with server.client() as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        assert client.get("/readyz").status_code == 200
        assert client.get("/mutate").status_code == 405


def test_logs_are_json_lines_with_the_request_uid(server: Server) -> None:
    with server.client() as client:
        client.post("/mutate", json=admission_review(KINDS["Pod"][0](), uid="log-uid-42"))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        entries = [json.loads(line) for line in server.log_path.read_text().splitlines() if line.startswith("{")]
        mine = [e for e in entries if e.get("uid") == "log-uid-42"]
        if mine:
            break
        time.sleep(0.05)
    assert mine and mine[0]["msg"] == "admission" and mine[0]["webhook"] == "mutate"
    assert mine[0]["outcome"] == "patched" and mine[0]["status"] == 200 and mine[0]["duration_ms"] > 0


def test_certificate_rotation_is_picked_up_without_restart(server: Server) -> None:
    before = server.peer_certificate()
    rotated = write_server_pair(server.ca, server.cert_dir, common_name="vramfit-webhook-rotated")
    wanted = rotated.public_bytes(Encoding.DER)
    assert wanted != before
    deadline = time.monotonic() + 15
    while server.peer_certificate() != wanted:
        assert time.monotonic() < deadline, "rotated certificate not served within 15 s"
        time.sleep(0.1)
    with server.client() as client:  # and the server still answers over the new certificate
        assert client.get("/healthz").status_code == 200
