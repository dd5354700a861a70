"""trainer.kubeflow.org TrainJob (Kubeflow Trainer v2) and the runtime it references.

Nodes: ``spec.trainer.numNodes``, else the runtime's ``mlPolicy.numNodes``, else 1. GPUs per node:
``spec.trainer.resourcesPerNode``, else the runtime's trainer container (replicated Job ``node``) when
that runtime (ClusterTrainingRuntime / TrainingRuntime) is in the same file or given with
``--runtime``. The command line is the TrainJob's ``trainer.command``/``args`` when set, else the
runtime's; env is the runtime's overlaid with the TrainJob's. The model may also come from the model
initializer (``spec.initializer.model.storageUri``, or the runtime's ``STORAGE_URI``).
Pointer ``/spec/trainer``: the TrainJob holds no pod template (node selection goes through
``spec.runtimePatches``).
"""

from __future__ import annotations

from typing import Any

from scheduler.spec.merge import Context, Workload
from scheduler.spec.pods import (
    Container,
    GpuPin,
    ObjectRef,
    Path,
    Role,
    count,
    get,
    gpu_pin,
    metadata,
    named_roles,
    read_container,
    read_env,
    read_pod_template,
    read_resources,
)
from scheduler.spec.trainer_args import Setting

RUNTIME_KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")
_TRAINER_JOBS = ("node", "trainer-node", "trainer")
_ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"


def _replicated_jobs(
    obj: ObjectRef, runtime_spec: dict[str, Any], path: Path
) -> list[tuple[Path, dict[str, Any]]]:
    template = get(obj, runtime_spec, "template", path, dict, {})
    jobset = get(obj, template, "spec", (*path, "template"), dict, {})
    items = named_roles(
        obj, jobset.get("replicatedJobs"), (*path, "template", "spec", "replicatedJobs"), "replicated Jobs"
    )
    return [((*path, "template", "spec", "replicatedJobs", i), item) for i, item in items]


def _dig(node: Any, *keys: str) -> Any:
    """``node[k1][k2]...``, or ``None`` where a level is missing or not a mapping (the callers that need a level
    report a wrong type with its path)."""
    for key in keys:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def _is_trainer(job: dict[str, Any]) -> bool:
    labels = _dig(job, "template", "metadata", "labels")
    return (isinstance(labels, dict) and labels.get(_ANCESTOR) == "trainer") or job.get("name") in _TRAINER_JOBS


def _pod_template(job: dict[str, Any]) -> Any:
    return _dig(job, "template", "spec", "template")


def _runtime_trainer(obj: ObjectRef, runtime: dict[str, Any]) -> tuple[Role | None, str | None, int | None]:
    """The runtime's trainer role (its first container is the trainer), model URI, and mlPolicy numNodes."""
    spec = get(obj, runtime, "spec", (), dict, {})
    nodes = get(obj, spec, "mlPolicy", ("spec",), dict, {}).get("numNodes")
    role, model = None, None
    for path, job in _replicated_jobs(obj, spec, ("spec",)):
        template = _pod_template(job)
        if role is None and _is_trainer(job):
            role = read_pod_template(obj, template, (*path, "template", "spec", "template"), "node", 1)
            named = [c for c in role.containers if c.name in ("node", "trainer")]
            role.containers = named + [c for c in role.containers if c not in named]
        elif job.get("name") == "model-initializer" and isinstance(template, dict):
            init = read_pod_template(
                obj, template, (*path, "template", "spec", "template"), "model-initializer", 1
            )
            model = next((c.env["STORAGE_URI"] for c in init.containers if "STORAGE_URI" in c.env), None)
    return role, model, int(nodes) if isinstance(nodes, int) else None


def _patch_pin(obj: ObjectRef, spec: dict[str, Any]) -> GpuPin | None:
    """A GPU pin set through ``spec.runtimePatches`` (Trainer >= 2.1), ``spec.podTemplateOverrides`` (its
    ``spec``) or ``spec.podSpecOverrides`` (Trainer 2.0)."""
    for i, patch in named_roles(
        obj, spec.get("runtimePatches"), ("spec", "runtimePatches"), "runtime patches"
    ):
        runtime_spec = patch.get("trainingRuntimeSpec")
        if not isinstance(runtime_spec, dict):
            continue
        for path, job in _replicated_jobs(
            obj, runtime_spec, ("spec", "runtimePatches", i, "trainingRuntimeSpec")
        ):
            pod = _dig(_pod_template(job), "spec")
            if _is_trainer(job) and isinstance(pod, dict):
                pin = gpu_pin(obj, pod, (*path, "template", "spec", "template", "spec"))
                if pin is not None:
                    return pin
    for i, override in named_roles(
        obj, spec.get("podTemplateOverrides"), ("spec", "podTemplateOverrides"), "overrides"
    ):
        targets = override.get("targetJobs")
        names = {t.get("name") for t in targets if isinstance(t, dict)} if isinstance(targets, list) else set()
        pod = override.get("spec")
        if isinstance(pod, dict) and names & {"node", "trainer"}:
            pin = gpu_pin(obj, pod, ("spec", "podTemplateOverrides", i, "spec"))
            if pin is not None:
                return pin
    for i, override in named_roles(
        obj, spec.get("podSpecOverrides"), ("spec", "podSpecOverrides"), "overrides"
    ):
        pin = gpu_pin(obj, override, ("spec", "podSpecOverrides", i))
        if pin is not None:
            return pin
    return None


def parse(doc: dict[str, Any], ctx: Context) -> Workload:
    obj, annotations = metadata(doc, "TrainJob", ctx.source, ctx.configmaps)
    spec = get(obj, doc, "spec", (), dict, required=True, hint="a TrainJob needs spec.runtimeRef")
    ref = get(obj, spec, "runtimeRef", ("spec",), dict, {})
    runtime_kind = str(ref.get("kind") or "ClusterTrainingRuntime")
    runtime_name = str(ref.get("name") or "")
    runtime = ctx.runtimes.get((runtime_kind, runtime_name))
    runtime_role, runtime_model, runtime_nodes = (None, None, None)
    if runtime is not None:
        robj, _ = metadata(runtime, runtime_kind, ctx.source)
        runtime_role, runtime_model, runtime_nodes = _runtime_trainer(robj, runtime)
    trainer = get(obj, spec, "trainer", ("spec",), dict, {})
    path: Path = ("spec", "trainer")
    nodes = count(obj, trainer, "numNodes", path, runtime_nodes or 1)
    gpus, unsized = read_resources(obj, trainer.get("resourcesPerNode"), (*path, "resourcesPerNode"))
    source = "trainer.resourcesPerNode nvidia.com/gpu"
    base_container = runtime_role.containers[0] if runtime_role and runtime_role.containers else None
    if not gpus and runtime_role is not None:
        gpus, source = runtime_role.gpus_per_pod, f"{runtime_kind} {runtime_name} node container"
    container = _trainer_container(obj, trainer, path, base_container)
    pin = _patch_pin(obj, spec) or (runtime_role.pin if runtime_role else None)
    role = Role("node", path, nodes, gpus, source if gpus else "", [container], pin)
    role.unsized = list(unsized) if unsized else (list(runtime_role.unsized) if runtime_role and not gpus else [])
    w = Workload(obj, annotations, [role], files=ctx.files, configmaps=ctx.configmaps)
    model_uri = get(
        obj, get(obj, spec, "initializer", ("spec",), dict, {}), "model", ("spec", "initializer"), dict, {}
    ).get("storageUri")
    if model_uri or runtime_model:
        where = (
            "spec.initializer.model.storageUri" if model_uri else f"{runtime_kind} {runtime_name} STORAGE_URI"
        )
        uri = str(model_uri or runtime_model)
        w.base["model"] = Setting(uri.removeprefix("hf://"), f"model initializer {uri}", where)
    if runtime is None and not gpus:
        w.no_gpu_reason = (
            f"spec.trainer.resourcesPerNode requests no nvidia.com/gpu, and the runtime "
            f"{runtime_kind} {runtime_name!r} that may set them is not in this file "
            "(put it in the same file or pass --runtime FILE)"
        )
    elif runtime is None:
        w.notes.append(
            f"runtime {runtime_kind} {runtime_name!r} not given: only the TrainJob's own fields read"
        )
    return w


def _trainer_container(
    obj: ObjectRef, trainer: dict[str, Any], path: Path, base: Container | None
) -> Container:
    """The TrainJob's trainer fields over the runtime's trainer container.

    ``command`` replaces the runtime's command and ``args`` its args, each on its own (as Kubernetes does for a
    container's image: a TrainJob that only adds torchtune overrides through ``args`` keeps ``tune run ...``);
    ``env`` is merged over it.
    """
    own = read_container(obj, {k: trainer.get(k) for k in ("command", "args", "env")}, path)
    if base is None:
        return own
    env = {**base.env, **read_env(obj, trainer.get("env"), (*path, "env"))}
    command = own.argv[:own.n_command] if trainer.get("command") else base.argv[:base.n_command]
    args = own.argv[own.n_command:] if trainer.get("args") else base.argv[base.n_command:]
    return Container("node", path if own.argv else base.path, (*command, *args), env, 0, len(command),
                     mounted=base.mounted)  # the runtime pod template's volumes
