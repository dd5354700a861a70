"""Shared readers for upstream objects: field paths, pod templates, containers, GPU requests, GPU pins.

Upstream objects (Kubernetes, Kubeflow, KubeRay, Volcano) are read leniently: only the fields used
here are looked at, anything else is ignored. A field that is used but has the wrong shape is an
error that names the object and the field path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import PurePosixPath
from typing import Any

from predictors.errors import SpecError
from predictors.hardware import lookup_gpu
from predictors.units import QuantityError, parse_count
from scheduler.spec.yamltext import TextBudget, substitute_within

Path = tuple[str | int, ...]

GPU_RESOURCE = "nvidia.com/gpu"

# Device resources that are not whole NVIDIA GPUs, which vramfit does not size (its catalog holds whole NVIDIA GPUs):
# a MIG slice (`nvidia.com/mig-1g.10gb`: the memory of the slice, not of the GPU; NVIDIA GPU Operator docs, "GPU
# Operator with MIG", mixed strategy), a time-sliced share renamed by the device plugin (`nvidia.com/gpu.shared`:
# k8s-device-plugin README, "Shared Access to GPUs", renameByDefault), other vendors' accelerators.
_OTHER_DEVICE = re.compile(
    r"nvidia\.com/(mig-.+|gpu\.shared)|amd\.com/gpu|gpu\.intel\.com/.+|habana\.ai/gaudi|google\.com/tpu"
    r"|aws\.amazon\.com/neuron(core|device)?"
)
# KAI scheduler (run:ai) GPU sharing: pod annotations asking for a fraction or an amount of one GPU's memory instead
# of whole GPUs (KAI-Scheduler docs/gpu-sharing/README.md).
SHARING_ANNOTATIONS = ("gpu-fraction", "gpu-memory")
# `nvidia.com/gpu.product` values of GPU feature discovery for a MIG slice (single strategy: the slice is exposed
# as nvidia.com/gpu, the product gets `-MIG-<profile>`) or a time-sliced GPU (`-SHARED`).
_SLICED_PRODUCT = re.compile(r".*-(MIG-.+|SHARED)", re.IGNORECASE)
# Kubernetes counts (replicas, parallelism, completions, numOfHosts) are int32 in every API read here.
MAX_INT32 = 2**31 - 1

# Node labels that name the GPU model of a node (GPU feature discovery, GKE, Karpenter, KubeRay).
GPU_LABELS: tuple[str, ...] = (
    "nvidia.com/gpu.product",
    "cloud.google.com/gke-accelerator",
    "karpenter.k8s.aws/instance-gpu-name",
    "ray.io/accelerator-type",
    "eks.amazonaws.com/instance-gpu-name",  # EKS Auto Mode (the same values as Karpenter's)
    "gpu.nvidia.com/class",  # CoreWeave (A100_NVLINK_80GB, H100_NVLINK_80GB, A40, ...)
    "gpu.nvidia.com/model",  # CoreWeave's older label
    "node.kubernetes.io/instance-type",  # the cloud machine type: its GPU by _INSTANCE_GPUS
    "beta.kubernetes.io/instance-type",
    "karpenter.k8s.aws/instance-family",  # Karpenter's EC2 family (p5, g6e): its GPU by _INSTANCE_GPUS
)
_INSTANCE_TYPE_LABELS = frozenset({"node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type"})
_INSTANCE_FAMILY_LABEL = "karpenter.k8s.aws/instance-family"
# Cloud machine types and the GPU they carry (the providers' instance pages: aws.amazon.com/ec2/instance-types,
# cloud.google.com/compute/docs/gpus, learn.microsoft.com/azure/virtual-machines/sizes), matched on the type's
# prefix, longest first; a machine type of no listed family pins nothing.
_INSTANCE_GPUS: dict[str, str] = {
    "p4d.": "A100-40GB", "p4de.": "A100-80GB", "p5.": "H100-80GB", "p5e.": "H200", "p5en.": "H200",
    "p6-b200.": "B200", "p3dn.": "V100-32GB", "p3.": "V100-16GB", "g4dn.": "T4", "g5.": "A10G", "g6.": "L4",
    "g6e.": "L40S",
    "a2-highgpu-": "A100-40GB", "a2-megagpu-": "A100-40GB", "a2-ultragpu-": "A100-80GB", "a3-highgpu-": "H100-80GB",
    "a3-megagpu-": "H100-80GB", "a3-edgegpu-": "H100-80GB", "a3-ultragpu-": "H200", "a4-highgpu-": "B200",
    "g2-standard-": "L4",
    "standard_nd96asr_v4": "A100-40GB", "standard_nd96amsr_a100_v4": "A100-80GB",
    "standard_nd96isr_h100_v5": "H100-80GB", "standard_nd96isr_h200_v5": "H200",
    # Oracle Cloud's bare-metal GPU shapes (docs.oracle.com/iaas/Content/Compute/References/computeshapes.htm)
    "bm.gpu.h100.": "H100-80GB", "bm.gpu.h200.": "H200", "bm.gpu.a100-v2.": "A100-80GB", "bm.gpu4.": "A100-40GB",
    "bm.gpu.l40s": "L40S", "bm.gpu.b200.": "B200",
    # Nebius platforms (docs.nebius.com/compute/virtual-machines/types: gpu-h100-sxm, gpu-h200-sxm, gpu-b200-sxm,
    # gpu-l40s-a / -d), as their node labels write them (<platform>.<preset>)
    "gpu-h100-sxm": "H100-80GB", "gpu-h200-sxm": "H200", "gpu-b200-sxm": "B200", "gpu-l40s-": "L40S",
}
# SageMaker HyperPod writes the EC2 type with its ml. prefix (ml.p5.48xlarge)
_SAGEMAKER_PREFIX = "ml."
# GKE accelerator values whose memory size the name leaves out (the others map by name).
_GKE_ACCELERATORS: dict[str, str] = {
    "nvidia-tesla-a100": "A100-40GB",
    "nvidia-tesla-v100": "V100-16GB",
    "nvidia-h100-mega-80gb": "H100-80GB",
}


def dotted(path: Path) -> str:
    """``("spec", "containers", 0, "args")`` -> ``spec.containers[0].args`` (the error-message form)."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "." in part or "/" in part:
            out += f'["{part}"]'
        else:
            out += f".{part}" if out else part
    return out


def pointer(path: Path) -> str:
    """RFC 6901 JSON pointer of a path: ``~`` -> ``~0``, ``/`` -> ``~1``."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


@dataclass(frozen=True)
class ObjectRef:
    """The object being read, for error messages: ``kind namespace/name`` and the file; and what ``$(VAR)``
    expansion may still add to it."""

    kind: str
    name: str
    namespace: str
    source: str
    expansion: TextBudget = field(default_factory=lambda: TextBudget(MAX_EXPANSION_GROWTH_CHARS), compare=False,
                                  repr=False)
    # the ConfigMaps of the same file, by name then key: what a container's envFrom / configMapKeyRef reads
    configmaps: Mapping[str, Mapping[str, str]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def ref(self) -> str:
        who = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {who}".strip()

    def error(self, path: Path | str, message: str, hint: str = "") -> SpecError:
        where = path if isinstance(path, str) else dotted(path)
        label = f"{self.source}: {self.ref}" if self.source else self.ref
        return SpecError.one(where, message, hint, label)


def get(
    obj: ObjectRef,
    data: Mapping[str, Any],
    key: str,
    path: Path,
    kind: type | tuple[type, ...],
    default: Any = None,
    required: bool = False,
    hint: str = "",
) -> Any:
    """``data[key]`` when present and of the expected type; ``default`` when absent; else an error."""
    value = data.get(key)
    if value is None:
        if required:
            raise obj.error((*path, key), "is missing", hint)
        return default
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
        names = " or ".join(_type_name(t) for t in _as_tuple(kind))
        raise obj.error((*path, key), f"must be {names}; got {type(value).__name__}", hint)
    return value


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _type_name(t: type) -> str:
    return {
        dict: "a mapping",
        list: "a list",
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "true or false",
    }.get(t, t.__name__)


def count(obj: ObjectRef, data: Mapping[str, Any], key: str, path: Path, default: int) -> int:
    """A non-negative whole count (replicas, parallelism, numNodes)."""
    value = data.get(key)
    if value is None:
        return default
    try:
        n = parse_count(value, key)
    except QuantityError as exc:
        raise obj.error((*path, key), str(exc).replace(f"{key} ", "", 1)) from None
    if n < 0:
        raise obj.error((*path, key), f"must not be negative; got {value!r}")
    if n > MAX_INT32:
        raise obj.error((*path, key), f"must be at most {MAX_INT32:,} (an int32 in the Kubernetes API); got {n:,}")
    return n


def metadata(data: Mapping[str, Any], kind: str, source: str,
             configmaps: Mapping[str, Mapping[str, str]] | None = None) -> tuple[ObjectRef, dict[str, str]]:
    """The object's name/namespace reference and its annotations (values as strings)."""
    meta = data.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    name = meta.get("name") or meta.get("generateName") or ""
    ref = ObjectRef(kind, str(name), str(meta.get("namespace") or ""), source, configmaps=configmaps or {})
    raw = get(ref, meta, "annotations", ("metadata",), dict, {})
    return ref, {str(k): "" if v is None else str(v) for k, v in raw.items()}


@dataclass(frozen=True)
class Container:
    """One container: its command line (command + args, ``$(VAR)`` expanded), env and GPU request."""

    name: str
    path: Path
    argv: tuple[str, ...]
    env: dict[str, str]
    gpus: int
    n_command: int = 0  # how many of argv's items came from `command` (the rest from `args`)
    unsized: tuple[str, ...] = ()  # device requests that are not whole NVIDIA GPUs, each with its field path
    mounted: tuple[MountedFile, ...] = ()  # ConfigMap keys it sees under another file name


@dataclass(frozen=True)
class MountedFile:
    """A ConfigMap key that a container sees under another file name: a volume's ``items`` path, or a volumeMount's
    ``subPath`` mounted at a path of its own. Kubernetes projects ``items[].key`` to ``items[].path`` and nothing
    else of that ConfigMap; a ``subPath`` mount puts that one file (or item path) at ``mountPath``
    (kubernetes.io/docs/concepts/storage/volumes, "configMap" and "Using subPath")."""

    name: str  # the file name the container sees (the last part of its path)
    config_map: str
    key: str


@dataclass(frozen=True)
class GpuPin:
    """A node label in a nodeSelector or required node affinity that names one GPU model."""

    label: str
    value: str
    path: Path
    gpu: str | None  # catalog name, None when the catalog does not know it


@dataclass
class Role:
    """A set of identical pods of a job (Master, Worker, a worker group, a Volcano task)."""

    name: str
    path: Path  # of the pod spec (or, for a TrainJob, of spec.trainer)
    replicas: int
    gpus_per_pod: int
    gpu_source: str  # how the per-pod GPU count was read
    containers: list[Container] = field(default_factory=list)
    pin: GpuPin | None = None
    notes: list[str] = field(default_factory=list)
    # what the pods ask for besides whole NVIDIA GPUs (MIG slices, shared GPUs, other vendors' devices, DRA
    # claims), each with its field path: vramfit does not size these
    unsized: list[str] = field(default_factory=list)

    @property
    def gpus(self) -> int:
        return self.replicas * self.gpus_per_pod


_K8S_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


# How many characters ``$(VAR)`` expansion may add to one object. Env values may name earlier ones, so ten
# references per value make 10**k characters of k short values (nine levels: a gigabyte, and the process killed
# for memory), and every arg of every container may name the largest; past this, references are left as written.
MAX_EXPANSION_GROWTH_CHARS = 256 * 1024


def expand_k8s_vars(text: str, env: Mapping[str, str], budget: TextBudget | None = None) -> str:
    """Kubernetes expands ``$(VAR)`` in command and args from the container's env; unknown ones stay, and so
    do those that would take more than ``budget`` (the object's) has left."""
    return substitute_within(_K8S_VAR, text, lambda m: env.get(m.group(1)),
                             budget or TextBudget(MAX_EXPANSION_GROWTH_CHARS))


def read_env(obj: ObjectRef, items: Any, path: Path, env_from: Any = None) -> dict[str, str]:
    """A container's environment as far as the file shows it: ``envFrom`` ConfigMaps of the same file (each
    ``configMapRef`` with its ``prefix``; ``env`` entries win, as Kubernetes gives them precedence), then ``env:``
    literal values and ``valueFrom.configMapKeyRef`` keys of those ConfigMaps (other ``valueFrom`` sources, Secrets
    and field references, are unknown until runtime)."""
    env: dict[str, str] = {}
    for source in env_from if isinstance(env_from, list) else ():
        ref = source.get("configMapRef") if isinstance(source, dict) else None
        data = obj.configmaps.get(str(ref.get("name"))) if isinstance(ref, dict) else None
        prefix = str(source.get("prefix") or "") if isinstance(source, dict) else ""
        for key, value in (data or {}).items():
            if _ENV_NAME.fullmatch(prefix + key):  # kubelet skips keys that are no valid variable names
                env[prefix + key] = value
    if items is None:
        return env
    if not isinstance(items, list):
        raise obj.error(path, f"must be a list of {{name, value}}; got {type(items).__name__}")
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise obj.error((*path, i), "must be a mapping with a `name`")
        if "value" in item and item["value"] is not None:
            env[item["name"]] = expand_k8s_vars(str(item["value"]), env, obj.expansion)
            continue
        key_ref = item.get("valueFrom", {}).get("configMapKeyRef") if isinstance(item.get("valueFrom"), dict) \
            else None
        if isinstance(key_ref, dict):
            value = obj.configmaps.get(str(key_ref.get("name")), {}).get(str(key_ref.get("key")))
            if value is not None:
                env[item["name"]] = value
    return env


# an environment variable name as the kubelet accepts it from envFrom (C identifiers; it also allows '.' and '-')
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")


def gpu_quantity(obj: ObjectRef, resources: Any, path: Path) -> int:
    """The ``nvidia.com/gpu`` count of a ``resources`` block (0 when it asks for none)."""
    return read_resources(obj, resources, path)[0]


def read_resources(obj: ObjectRef, resources: Any, path: Path) -> tuple[int, tuple[str, ...]]:
    """The ``nvidia.com/gpu`` count of a ``resources`` block, and the device requests in it that are not whole
    NVIDIA GPUs (MIG slices, other vendors, DRA ``claims``), each named with its field path.

    GPUs are an extended resource: Kubernetes copies limits into absent requests, and refuses requests that differ
    from limits (kubernetes.io/docs/concepts/configuration/manage-resources-containers, "Extended resources":
    "request and limit must be equal if both are present"). So the limit is the count, else the request.
    """
    if resources is None:
        return 0, ()
    if not isinstance(resources, dict):
        raise obj.error(path, f"must be a mapping (limits, requests); got {type(resources).__name__}")
    blocks = {section: get(obj, resources, section, path, dict, {}) for section in ("limits", "requests")}
    counts: dict[str, int] = {}
    for section, block in blocks.items():
        if GPU_RESOURCE in block:
            value = block[GPU_RESOURCE]
            n = _whole_gpus(value)
            if n is None:
                raise obj.error(
                    (*path, section, GPU_RESOURCE),
                    f"must be a whole number of GPUs, 0 or more; got {value!r}",
                    'GPUs are requested as whole devices, e.g. 1 or "8" (a Kubernetes quantity: "500m" is half '
                    "a GPU, which the device plugin cannot give)",
                )
            if n > MAX_GPUS_PER_POD:
                raise obj.error((*path, section, GPU_RESOURCE),
                                f"asks for {n:,} GPUs in one pod; no node has more than {MAX_GPUS_PER_POD}",
                                "spread the job over more pods (replicas) with fewer GPUs each")
            counts[section] = n
    if len(counts) == 2 and counts["limits"] != counts["requests"]:
        raise obj.error(
            (*path, "requests", GPU_RESOURCE),
            f"is {counts['requests']} but the limit is {counts['limits']}; Kubernetes refuses a GPU request that "
            "differs from its limit (extended resources cannot be overcommitted)",
            f"set only limits[\"{GPU_RESOURCE}\"] (the request follows it), or make both equal",
        )
    unsized: list[str] = []
    for section, block in blocks.items():
        for name in block:
            if _OTHER_DEVICE.fullmatch(str(name)) and (section == "limits" or name not in blocks["limits"]):
                unsized.append(f"{dotted((*path, section, str(name)))} = {block[name]}")
    claims = resources.get("claims")
    if isinstance(claims, list) and claims:
        unsized.append(f"{dotted((*path, 'claims'))} (a DRA resource claim)")
    return counts.get("limits", counts.get("requests", 0)), tuple(unsized)


# The most GPUs one node (so one pod) has; pools allow no more per node either.
MAX_GPUS_PER_POD = 64
# A Kubernetes quantity without a suffix: 8, +8, 8.0, 8e0 (resource.Quantity's decimal forms).
_DECIMAL_QUANTITY = re.compile(r"\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]{1,2})?")


def _whole_gpus(value: Any) -> int | None:
    """A Kubernetes quantity that is a whole, non-negative number of devices (``8``, ``"8"``, ``"8.0"``), else None.
    Suffixes are refused: in a quantity ``m`` is milli, so ``500m`` is half a device."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float):
        return int(value) if value.is_integer() and value >= 0 else None
    text = value.strip() if isinstance(value, str) else ""
    if len(text) <= 24 and _DECIMAL_QUANTITY.fullmatch(text):
        number = Decimal(text)
        return int(number) if number == number.to_integral_value() else None
    return None


def read_container(obj: ObjectRef, data: Any, path: Path) -> Container:
    if not isinstance(data, dict):
        raise obj.error(path, f"must be a mapping (a container); got {type(data).__name__}")
    env = read_env(obj, data.get("env"), (*path, "env"), data.get("envFrom"))
    argv: list[str] = []
    n_command = 0
    for key in ("command", "args"):
        items = get(obj, data, key, path, list, [])
        # an unquoted YAML true/false is a bool here; the API server wants strings, and a script compares the word as
        # written (`if [ $DO = true ]`), not Python's "True"
        argv += [expand_k8s_vars(str(x).lower() if isinstance(x, bool) else str(x), env, obj.expansion)
                 for x in items if x is not None]
        n_command = n_command or (len(argv) if key == "command" else 0)
    gpus, unsized = read_resources(obj, data.get("resources"), (*path, "resources"))
    return Container(str(data.get("name") or ""), path, tuple(argv), env, gpus, n_command, unsized)


# A pod volume's ConfigMap sources: (ConfigMap name, {item path: key}, or None where every key is a file).
_VolumeSources = list[tuple[str, dict[str, str] | None]]


def _config_map_volumes(volumes: Any) -> dict[str, _VolumeSources]:
    """The pod's ``configMap`` and ``projected`` volumes by volume name. Malformed entries are skipped: the API
    server refuses them, and they only decide which file name a container sees a ConfigMap key under."""
    found: dict[str, _VolumeSources] = {}
    for volume in volumes if isinstance(volumes, list) else ():
        if not isinstance(volume, dict) or not isinstance(volume.get("name"), str):
            continue
        sources = [volume.get("configMap")]
        projected = volume.get("projected")
        if isinstance(projected, dict) and isinstance(projected.get("sources"), list):
            sources += [s.get("configMap") for s in projected["sources"] if isinstance(s, dict)]
        read: _VolumeSources = []
        for source in sources:
            if not isinstance(source, dict) or not isinstance(source.get("name"), str):
                continue
            items = source.get("items")
            paths = ({str(i["path"]): str(i["key"]) for i in items if isinstance(i, dict)
                      and isinstance(i.get("key"), str) and isinstance(i.get("path"), str)}
                     if isinstance(items, list) and items else None)
            read.append((source["name"], paths))
        if read:
            found[volume["name"]] = read
    return found


def _mounted_files(container: Any, volumes: Mapping[str, _VolumeSources]) -> tuple[MountedFile, ...]:
    """The ConfigMap keys ``container`` sees under a file name other than the key (see :class:`MountedFile`)."""
    mounts = container.get("volumeMounts") if isinstance(container, dict) else None
    found: list[MountedFile] = []
    for mount in mounts if isinstance(mounts, list) else ():
        if not isinstance(mount, dict) or not isinstance(mount.get("name"), str) or mount["name"] not in volumes:
            continue  # a malformed mount (a list for a name) is the API server's to refuse; it names no file here
        sub_path = mount.get("subPath")
        mount_path = mount.get("mountPath")
        for config_map, paths in volumes[mount["name"]]:
            if isinstance(sub_path, str) and sub_path.strip("/"):
                if not isinstance(mount_path, str) or not PurePosixPath(mount_path).name:
                    continue
                relative = sub_path.strip("/")
                key = relative if paths is None else paths.get(relative)
                if key is not None and "/" not in key:
                    found.append(MountedFile(PurePosixPath(mount_path).name, config_map, key))
            elif paths is not None:
                found += [MountedFile(PurePosixPath(item_path).name, config_map, key)
                          for item_path, key in paths.items() if PurePosixPath(item_path).name]
    return tuple(found)


def read_pod_spec(
    obj: ObjectRef,
    spec: Any,
    path: Path,
    role: str,
    replicas: int,
    what: str = "pod template",
    annotations: Mapping[str, Any] | None = None,
    annotations_path: Path = (),
) -> Role:
    """A role from a pod spec: containers, GPUs per pod (as the scheduler counts them, below) and any GPU pin in
    its node selection; ``annotations`` are the pod's own (KAI GPU sharing is asked there).

    GPUs per pod (kubernetes.io/docs/concepts/workloads/pods/sidecar-containers, "Resource sharing within
    containers"): init containers run one at a time, each beside the native sidecars (init containers with
    ``restartPolicy: Always``) started before it, and the sidecars keep running beside the app containers. So the
    pod holds max(the largest init container + the sidecars before it, the app containers + every sidecar).
    """
    if not isinstance(spec, dict):
        got = "nothing" if spec is None else type(spec).__name__
        raise obj.error(
            path,
            f"must be a pod spec (a mapping with `containers`); got {got}",
            f"give the {what} a `spec.containers` list",
        )
    items = spec.get("containers")
    if not isinstance(items, list) or not items:
        raise obj.error(
            (*path, "containers"),
            "is missing or empty; a pod needs at least one container",
            f"add the training container to the {what}",
        )
    containers = [read_container(obj, c, (*path, "containers", i)) for i, c in enumerate(items)]
    volumes = _config_map_volumes(spec.get("volumes"))
    if volumes:
        containers = [replace(c, mounted=_mounted_files(item, volumes))
                      for c, item in zip(containers, items, strict=True)]
    inits = get(obj, spec, "initContainers", path, list, [])
    sidecar_gpus = init_gpus = 0
    unsized = [u for c in containers for u in c.unsized]
    for i, item in enumerate(inits):
        init = read_container(obj, item, (*path, "initContainers", i))
        unsized += init.unsized
        init_gpus = max(init_gpus, sidecar_gpus + init.gpus)
        if isinstance(item, dict) and item.get("restartPolicy") == "Always":
            sidecar_gpus += init.gpus
    gpus = max(sum(c.gpus for c in containers) + sidecar_gpus, init_gpus)
    claims = spec.get("resourceClaims")
    if isinstance(claims, list) and claims:
        unsized.append(f"{dotted((*path, 'resourceClaims'))} (DRA resource claims: devices vramfit cannot count)")
    for key in SHARING_ANNOTATIONS:
        if annotations and annotations.get(key) not in (None, ""):
            unsized.append(f"{key}={annotations[key]} in {dotted(annotations_path) or 'the annotations'} "
                           "(KAI GPU sharing)")
    pin = gpu_pin(obj, spec, path)
    if pin is not None and pin.label == GPU_LABELS[0] and _SLICED_PRODUCT.fullmatch(pin.value.strip()):
        # the device plugin hands out a MIG slice or a time-sliced share of a GPU as nvidia.com/gpu on such nodes
        what_slice = "a MIG slice" if "-mig-" in pin.value.lower() else "a time-sliced share of a GPU"
        unsized.append(f"{dotted(pin.path)} = {pin.value} ({GPU_RESOURCE} there is {what_slice})")
        gpus = 0
    return Role(
        role,
        path,
        replicas,
        gpus,
        f"{GPU_RESOURCE} limits" if gpus else "",
        containers,
        pin,
        unsized=unsized,
    )


def read_pod_template(obj: ObjectRef, template: Any, path: Path, role: str, replicas: int) -> Role:
    """A role from a PodTemplateSpec (``{metadata, spec}``) found at ``path``."""
    if not isinstance(template, dict):
        got = "nothing" if template is None else type(template).__name__
        raise obj.error(
            path,
            f"must be a pod template (metadata, spec); got {got}",
            "give the role a `template.spec.containers` list",
        )
    meta = get(obj, template, "metadata", path, dict, {})
    annotations = get(obj, meta, "annotations", (*path, "metadata"), dict, {})
    return read_pod_spec(obj, template.get("spec"), (*path, "spec"), role, replicas,
                         annotations=annotations, annotations_path=(*path, "metadata", "annotations"))


def map_gpu_label(label: str, value: str) -> str | None:
    """The catalog GPU a node label value names, or None when the catalog does not know it."""
    text = value.strip()
    if label == "cloud.google.com/gke-accelerator":
        text = _GKE_ACCELERATORS.get(text.lower(), re.sub(r"^nvidia-(tesla-)?", "", text.lower()))
    elif label in _INSTANCE_TYPE_LABELS or label == _INSTANCE_FAMILY_LABEL:
        lowered = text.lower().removeprefix(_SAGEMAKER_PREFIX)
        if label == _INSTANCE_FAMILY_LABEL:
            lowered += "."  # the family alone (p5) is the type's prefix (p5.48xlarge)
        family = max((p for p in _INSTANCE_GPUS if lowered.startswith(p)), key=len, default=None)
        return _INSTANCE_GPUS[family] if family is not None else None
    elif label.startswith("gpu.nvidia.com/"):
        # CoreWeave writes A100_NVLINK_80GB, A100_PCIE_40GB, H100_PCIE, RTX_A6000: the interconnect word is no GPU of
        # its own; its A100_NVLINK and A100_PCIE without a size are the 40 GB cards (CoreWeave's GPU instance table)
        parts = [p for p in text.upper().split("_") if p not in ("NVLINK", "SXM", "SXM4", "SXM5")]
        pcie = "PCIE" in parts
        parts = [p for p in parts if p != "PCIE"]
        if parts == ["A100"]:
            parts.append("40GB")
        text = "-".join(parts)
        if pcie:
            try:
                return lookup_gpu(f"{text}-PCIe").name
            except SpecError:
                pass  # the catalog has one card for both (A100-40GB): its memory is what placement needs
    try:
        return lookup_gpu(text).name
    except SpecError:
        return None


def gpu_pin(obj: ObjectRef, spec: Mapping[str, Any], path: Path) -> GpuPin | None:
    """The GPU model a pod spec's nodeSelector or required node affinity pins (one value only)."""
    selector = get(obj, spec, "nodeSelector", path, dict, {})
    for label in GPU_LABELS:
        if label in selector and selector[label] is not None:
            value = str(selector[label])
            return GpuPin(label, value, (*path, "nodeSelector", label), map_gpu_label(label, value))
    affinity = get(obj, spec, "affinity", path, dict, {})
    node_affinity = get(obj, affinity, "nodeAffinity", (*path, "affinity"), dict, {})
    required = get(obj, node_affinity, "requiredDuringSchedulingIgnoredDuringExecution",
                   (*path, "affinity", "nodeAffinity"), dict, {})
    terms = required.get("nodeSelectorTerms") or []
    for t, term in enumerate(terms if isinstance(terms, list) else []):
        exprs = term.get("matchExpressions") if isinstance(term, dict) else None
        for e, expr in enumerate(exprs if isinstance(exprs, list) else []):
            if not isinstance(expr, dict) or expr.get("key") not in GPU_LABELS:
                continue
            values = expr.get("values") or []
            if expr.get("operator") == "In" and isinstance(values, list) and len(values) == 1:
                where = (
                    *path,
                    "affinity",
                    "nodeAffinity",
                    "requiredDuringSchedulingIgnoredDuringExecution",
                    "nodeSelectorTerms",
                    t,
                    "matchExpressions",
                    e,
                )
                label = str(expr["key"])
                return GpuPin(label, str(values[0]), where, map_gpu_label(label, str(values[0])))
    return None


def named_roles(
    obj: ObjectRef, items: Any, path: Path, what: str, required: str = ""
) -> Sequence[tuple[int, dict[str, Any]]]:
    """A list of role mappings (replicatedJobs, tasks, workerGroupSpecs) with their indexes.

    With ``required`` (the hint to show), a missing or empty list is an error.
    """
    if not items and required:
        raise obj.error(path, "is missing or empty", required)
    if items is None:
        return []
    if not isinstance(items, list):
        raise obj.error(path, f"must be a list of {what}; got {type(items).__name__}")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise obj.error((*path, i), f"must be a mapping (one of the {what}); got {type(item).__name__}")
    return list(enumerate(items))
