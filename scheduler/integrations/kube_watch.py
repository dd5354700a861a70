"""Actuals from Kubernetes: a pod watch turned into completion times, exit reasons and CUDA OOMs.

:func:`handle_pod_event` is pure: one watch event (the dict the API server streams: ``type`` and ``object``)
in, a :class:`PodEventResult` out. Only pods carrying the ``vramfit.io/decision-id`` annotation (written by
the webhook into the pod template) count, and only once they are finished (phase Succeeded or Failed).

``oom`` means CUDA out of memory, found in a container's termination message (torch prints
"CUDA out of memory" / ``OutOfMemoryError``; set ``terminationMessagePolicy: FallbackToLogsOnError`` to
get it from the log tail). ``OOMKilled`` is the container's host-memory cgroup limit, not GPU memory: it is
kept as the exit reason with ``oom`` false, so that it does not count against the VRAM prediction.

:func:`watch_pods` is the live loop; it imports the ``kubernetes`` client lazily (``vramfit[kube]``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from scheduler.integrations.records import ActualIn
from scheduler.integrations.reporter import mentions_cuda_oom

log = logging.getLogger("vramfit.kube")

ANNOTATION_DECISION_ID = "vramfit.io/decision-id"
TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class PodEventResult:
    actual: ActualIn | None = None
    resync: bool = False  # the watch expired (410 Gone): list again from scratch
    resource_version: str | None = None
    ignored: str = ""  # why no actual came out of it


def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def handle_pod_event(event: dict[str, Any]) -> PodEventResult:
    kind = event.get("type")
    obj = event.get("raw_object") or event.get("object") or {}
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    if kind == "ERROR":
        gone = obj.get("code") == 410 or obj.get("reason") in ("Expired", "Gone")
        return PodEventResult(resync=gone, ignored=f"watch error: {obj.get('message', obj)}")
    if kind == "BOOKMARK":
        return PodEventResult(resource_version=rv, ignored="bookmark")
    if kind not in ("ADDED", "MODIFIED", "DELETED"):
        return PodEventResult(resource_version=rv, ignored=f"unknown event type {kind!r}")
    meta = obj.get("metadata") or {}
    decision_id = (meta.get("annotations") or {}).get(ANNOTATION_DECISION_ID)
    if not decision_id:
        return PodEventResult(resource_version=rv, ignored="no vramfit annotation")
    status = obj.get("status") or {}
    if status.get("phase") not in TERMINAL_PHASES:
        return PodEventResult(resource_version=rv, ignored=f"phase {status.get('phase')}")
    try:
        return PodEventResult(actual=actual_from_pod(decision_id, status), resource_version=rv)
    except (ValueError, TypeError, AttributeError) as exc:  # a user's pod: any field may be odd (ValidationError too)
        return PodEventResult(resource_version=rv, ignored=f"pod status not readable as an actual: {str(exc)[:200]}")


def actual_from_pod(decision_id: str, status: dict[str, Any]) -> ActualIn:
    """The actual of a finished pod from its status."""
    terminated = sorted(
        ((c.get("name", ""), (c.get("state") or {}).get("terminated")) for c in status.get("containerStatuses") or []),
        key=lambda pair: pair[0],
    )
    ends = [t for _, t in terminated if t]
    failing = next((t for t in ends if t.get("exitCode", 0) != 0), None)
    # a CUDA OOM also counts when a restarted container's previous attempt or an init container hit it
    earlier = [(c.get("lastState") or {}).get("terminated") for c in status.get("containerStatuses") or []]
    earlier += [(c.get("state") or {}).get("terminated") for c in status.get("initContainerStatuses") or []]
    cuda_oom = any(mentions_cuda_oom(t.get("message") or "") for t in [*ends, *(e for e in earlier if e)])
    starts = [s for s in (_time(t.get("startedAt")) for t in ends) if s] or [
        s for s in [_time(status.get("startTime"))] if s]
    finishes = [f for f in (_time(t.get("finishedAt")) for t in ends) if f]
    started, finished = (min(starts) if starts else None), (max(finishes) if finishes else None)
    if cuda_oom:
        reason = "CudaOOM"
    elif failing is not None:
        reason = failing.get("reason") or "Error"
    elif status.get("reason"):  # Evicted, DeadlineExceeded, ... (no container state to read)
        reason = status["reason"]
    else:
        reason = "Completed" if status.get("phase") == "Succeeded" else "Error"
    return ActualIn(
        decision_id=decision_id,
        peak_vram_bytes=None,
        runtime_seconds=(finished - started).total_seconds() if started and finished and finished >= started
        else None,
        oom=cuda_oom,
        exit_reason=reason,
        exit_code=failing.get("exitCode") if failing else (0 if ends else None),
        finished_at=finished,
        source="kubernetes",
    )


def watch_pods(
    sink: Callable[[ActualIn], object], stop: threading.Event, namespace: str | None = None,
    timeout_seconds: int = 300,
) -> None:  # pragma: no cover - needs a cluster; the event handling above is what the tests cover
    """Watch pods until ``stop`` is set, passing every finished vramfit pod's actual to ``sink``."""
    from kubernetes import client, config, watch  # type: ignore[import-not-found]
    from kubernetes.client.exceptions import ApiException  # type: ignore[import-not-found]

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    api = client.CoreV1Api()
    resource_version: str | None = None
    while not stop.is_set():
        lister = api.list_namespaced_pod if namespace else api.list_pod_for_all_namespaces
        kwargs: dict[str, Any] = {"namespace": namespace} if namespace else {}
        w = watch.Watch()
        try:
            if resource_version is None:
                listing = lister(**kwargs)
                for pod in listing.items:
                    raw = api.api_client.sanitize_for_serialization(pod)
                    _deliver(sink, handle_pod_event({"type": "ADDED", "raw_object": raw}))
                resource_version = listing.metadata.resource_version
            for event in w.stream(lister, resource_version=resource_version, timeout_seconds=timeout_seconds,
                                  allow_watch_bookmarks=True, **kwargs):
                result = handle_pod_event(event)
                if result.resync:
                    resource_version = None
                    break
                if result.resource_version:
                    resource_version = result.resource_version
                _deliver(sink, result)
                if stop.is_set():
                    break
        except ApiException as exc:
            if exc.status == 410:
                resource_version = None
            else:
                log.warning("pod watch failed: %s", exc)
                stop.wait(5)
        except Exception as exc:  # a dropped connection (urllib3), a bad object: the watch goes on after a pause
            log.warning("pod watch interrupted, restarting it: %s: %s", type(exc).__name__, str(exc)[:300])
            stop.wait(5)
        finally:
            w.stop()


def _deliver(sink: Callable[[ActualIn], object], result: PodEventResult) -> None:
    """Pass an event's actual to ``sink``; a sink that fails (the ledger briefly unwritable) costs that actual,
    logged, not the watch."""
    if result.actual is None:
        return
    try:
        sink(result.actual)
    except Exception as exc:
        log.error("actual not stored: %s: %s", type(exc).__name__, str(exc)[:300],
                  extra={"fields": {"decision_id": result.actual.decision_id}})
