"""Device-peak actuals from Prometheus: the DCGM exporter's framebuffer-used gauge over a job's lifetime.

The DCGM exporter publishes ``DCGM_FI_DEV_FB_USED`` in MiB, one series per GPU, labelled with the pod and
namespace that hold the GPU. The peak of a finished job is the largest value of any of its devices over its
lifetime, i.e. the most loaded GPU (the reference runs' ``per_gpu`` scope):

    max(max_over_time(DCGM_FI_DEV_FB_USED{namespace="ns", pod=~"name-.*"}[<lifetime>s])
        or max_over_time(DCGM_FI_DEV_FB_USED{exported_namespace="ns", exported_pod=~"name-.*"}[<lifetime>s]))
      @ finished_at

The second selector is the same series scraped without ``honor_labels``: Prometheus then keeps the target's own
``namespace``/``pod`` (the exporter's pod, from Kubernetes service discovery) and renames the exporter's to
``exported_namespace``/``exported_pod``: what a ServiceMonitor without ``honorLabels: true`` gives (its default;
see NVIDIA/dcgm-exporter#85). Only one of the two carries a job's pods.

Only the standard library is used for HTTP (urllib), so this works wherever the collector runs.
"""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from scheduler.integrations.records import ActualIn, StoredDecision, utc

MIB = 2**20
DCGM_METRIC = "DCGM_FI_DEV_FB_USED"

# Pod names of a job's pods after its name, by kind (RE2), as the controllers name them: a bare Pod is itself;
# a batch Job's <name>-<5 random> (indexed: <name>-<index>-<5>); a JobSet's <name>-<job>-<i>-<j>-<5> (a
# TrainJob's JobSet takes its name); a PyTorchJob's <name>-master-0 / <name>-worker-N; a Volcano Job's
# <name>-<task>-N; a RayCluster's <name>-head-<5> / <name>-<group>-worker-<5> (a RayJob's cluster is
# <name>-<5>). Each ends on the controller's own suffix, so a Pod, PyTorchJob or RayJob `llama` does not take
# `llama-70b`'s pods. A JobSet's or TrainJob's replicated-job name and a RayCluster's group name may hold dashes,
# so there (and for a kind not listed) `llama` also matches the pods of `llama-70b` of that kind in the same
# namespace: pod names cannot tell the two apart. A batch Job's pod whose random suffix is all digits matches
# the Volcano alternative of a shorter name the same way (rare).
_RAND = "[a-z0-9]{5}"
# what the API server appends to a generateName: 5 characters of k8s.io/apimachinery's util/rand alphabet
_GENERATED = "[bcdfghjklmnpqrstvwxz2456789]{5}"
_POD_SUFFIX: dict[str, str] = {
    "Pod": "",
    "Job": f"-([0-9]+-)?{_RAND}",
    "JobSet": f"-.+-[0-9]+-[0-9]+-{_RAND}",
    "TrainJob": f"-.+-[0-9]+-[0-9]+-{_RAND}",
    "PyTorchJob": "-(master|worker)-[0-9]+",
    "RayCluster": f"-(head|.+-worker)-{_RAND}",
    "RayJob": f"-{_RAND}-(head|.+-worker)-{_RAND}",
}
_RE2_SPECIAL = re.compile(r"([\\.+*?()|\[\]{}^$])")


class PrometheusError(RuntimeError):
    """Prometheus could not be queried, or answered something other than a vector."""


@dataclass(frozen=True)
class DevicePeak:
    peak_vram_bytes: int
    devices: int  # series (GPUs) that had samples in the window


def promql_string(text: str) -> str:
    """``text`` as a PromQL double-quoted string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _re2_escape(name: str) -> str:
    return _RE2_SPECIAL.sub(r"\\\1", name)


def pod_regex(kind: str | None, name: str, generated: bool = False) -> str:
    """An RE2 pattern matching the pod names of job ``name`` of ``kind`` (a kind not listed: ``<name>-...``;
    a Volcano Job shares the kind name Job but names its pods <name>-<task>-N, so Job allows both). ``generated``:
    ``name`` is the job's ``generateName``, which the API server completes with 5 characters of its own."""
    escaped = _re2_escape(name) + (_GENERATED if generated else "")
    if kind == "Job":
        return f"{escaped}({_POD_SUFFIX['Job']}|-.+-[0-9]+)"
    return escaped + _POD_SUFFIX.get(kind or "", "-.+")


def device_peaks_query(namespace: str, pods: str, window_seconds: int, exclude: str | None = None) -> str:
    """PromQL: the largest framebuffer use of each GPU series of pods matching ``pods`` (and not ``exclude``: the
    pods of other jobs whose names extend this one's) in ``namespace`` over the last ``window_seconds``, under the
    exporter's labels (``honor_labels``) or their ``exported_`` form."""
    ns, pod = promql_string(namespace), promql_string(pods)
    span = f"[{window_seconds}s]"
    other = f", pod!~{promql_string(exclude)}" if exclude else ""
    exported_other = f", exported_pod!~{promql_string(exclude)}" if exclude else ""
    return (f"max_over_time({DCGM_METRIC}{{namespace={ns}, pod=~{pod}{other}}}{span}) or "
            f"max_over_time({DCGM_METRIC}{{exported_namespace={ns}, exported_pod=~{pod}{exported_other}}}{span})")


def query_instant(prometheus_url: str, query: str, at: datetime, timeout_seconds: float = 10.0) -> list[dict]:
    """Run an instant query through the HTTP API and return the result vector."""
    params = urllib.parse.urlencode({"query": query, "time": f"{utc(at).timestamp():.3f}"})
    url = prometheus_url.rstrip("/") + "/api/v1/query?" + params
    try:
        with urllib.request.urlopen(url, timeout=timeout_seconds) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:300]
        raise PrometheusError(f"Prometheus answered {exc.code} to {query!r}: {detail}") from None
    except (urllib.error.URLError, TimeoutError, OSError, ValueError, RecursionError) as exc:  # ValueError: bad JSON
        raise PrometheusError(f"cannot query Prometheus at {prometheus_url}: {exc}") from None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, dict) or body.get("status") != "success" or data.get("resultType") != "vector":
        raise PrometheusError(f"unexpected answer to {query!r}: {str(body)[:300]}")
    result = data.get("result", [])
    if not isinstance(result, list):
        raise PrometheusError(f"unexpected answer to {query!r}: result is not a list: {str(result)[:300]}")
    return result


def sample_value(sample: Any, query: str) -> float:
    """The value of one instant-vector sample (``{"metric": ..., "value": [t, "v"]}``); NaN and infinities as
    Prometheus writes them. A malformed sample is a :class:`PrometheusError`."""
    try:
        return float(sample["value"][1])
    except (TypeError, KeyError, IndexError, ValueError):
        raise PrometheusError(f"unexpected sample in the answer to {query!r}: {str(sample)[:300]}") from None


def query_device_peak(
    prometheus_url: str, namespace: str, pods: str, start: datetime, end: datetime, slack_seconds: float = 30.0,
    timeout_seconds: float = 10.0, exclude: str | None = None,
) -> DevicePeak | None:
    """The largest framebuffer use of any matching device between ``start`` and ``end``, or None (no data).

    ``slack_seconds`` widens the window at the start so a scrape just before the job started still counts
    (a GPU's memory before the job is the previous tenant's, so keep it below the scrape interval x 2).
    """
    window = (utc(end) - utc(start)).total_seconds() + slack_seconds
    per_device = device_peaks_query(namespace, pods, max(1, math.ceil(window)), exclude)
    peak_query = f"max({per_device})"
    peak = query_instant(prometheus_url, peak_query, end, timeout_seconds)
    if not peak:
        return None
    mib = sample_value(peak[0], peak_query)
    if not math.isfinite(mib) or mib < 0:  # NaN/Inf/negative framebuffer readings are no measurement
        return None
    if mib > MAX_DEVICE_MIB:  # a broken exporter or a unit mix-up: no GPU has that much memory
        raise PrometheusError(f"DCGM framebuffer reading {mib:.4g} MiB for {peak_query!r} is more memory than any GPU "
                              f"has (at most {MAX_DEVICE_MIB:,} MiB); not stored")
    count_query = f"count({per_device})"
    devices = query_instant(prometheus_url, count_query, end, timeout_seconds)
    count = sample_value(devices[0], count_query) if devices else 1.0
    return DevicePeak(peak_vram_bytes=int(round(mib * MIB)),
                      devices=int(count) if math.isfinite(count) and count >= 1 else 1)


# More framebuffer than any GPU has (the largest, B300, 288 GB) by a wide margin: a reading above it is an exporter or
# unit error, and stored it would overflow the ledger's byte columns
MAX_DEVICE_MIB = 4 * 1024 * 1024


def dcgm_actual(
    prometheus_url: str, decision: StoredDecision, finished_at: datetime, started_at: datetime | None = None,
    other_names: Sequence[str] = (), **kwargs: float,
) -> ActualIn | None:
    """The DCGM device-peak actual of a finished job (from its decision's namespace, kind and name). ``other_names``:
    jobs of the namespace whose names extend this one's (``llama-70b`` for ``llama``), whose pods are left out."""
    d = decision.decision
    if d.namespace is None or d.name is None:
        return None
    exclude = "|".join(f"({_re2_escape(n)}-.+)" for n in other_names) or None
    peak = query_device_peak(prometheus_url, d.namespace, pod_regex(d.kind, d.name, d.generated_name),
                             started_at or decision.decided_at, finished_at, exclude=exclude, **kwargs)
    if peak is None:
        return None
    return ActualIn(decision_id=decision.decision_id, peak_vram_bytes=peak.peak_vram_bytes, runtime_seconds=None,
                    oom=False, source="dcgm", finished_at=finished_at, gpu=d.gpu)
