"""DCGM peaks from answers a real Prometheus would not normally give (NaN and infinite readings, malformed
bodies): no measurement or a PrometheusError, never an OverflowError or KeyError in the collector.

The normal path is tested against a real Prometheus in test_e2e_prometheus.py; here a loopback server plays
back canned bodies, because a real one cannot be made to answer malformed JSON.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from scheduler.integrations.prom_actuals import MIB, PrometheusError, query_device_peak
from tests.integrations.processes import serve_get

START = datetime(2026, 1, 1, tzinfo=timezone.utc)
END = START + timedelta(hours=1)


class Playback:
    """Answers each GET with the next of ``bodies`` (bytes, or JSON-encoded objects)."""

    def __init__(self) -> None:
        self.bodies: list[Any] = []
        self.server = serve_get(self._next)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def _next(self) -> tuple[bytes, str]:
        body = self.bodies.pop(0)
        return (body if isinstance(body, bytes) else json.dumps(body).encode()), "application/json"


@pytest.fixture
def prometheus() -> Iterator[Playback]:
    playback = Playback()
    yield playback
    playback.server.shutdown()


def vector(*values: str) -> dict[str, Any]:
    return {"status": "success",
            "data": {"resultType": "vector", "result": [{"metric": {}, "value": [0, v]} for v in values]}}


def test_a_finite_reading_is_the_peak(prometheus: Playback) -> None:
    prometheus.bodies = [vector("1024"), vector("2")]
    peak = query_device_peak(prometheus.url, "ns", "job-.+", START, END)
    assert peak is not None and (peak.peak_vram_bytes, peak.devices) == (1024 * MIB, 2)


@pytest.mark.parametrize("reading", ["NaN", "+Inf", "-Inf", "-5"])
def test_a_reading_that_is_not_a_size_is_no_measurement(prometheus: Playback, reading: str) -> None:
    prometheus.bodies = [vector(reading), vector("1")]
    assert query_device_peak(prometheus.url, "ns", "job-.+", START, END) is None


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[" * 5000 + b"]" * 5000,
        [1, 2],
        {"status": "success", "data": []},
        {"status": "success", "data": {"resultType": "vector", "result": "x"}},
        {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}},
        {"status": "success", "data": {"resultType": "vector", "result": [{"value": [0, "lots"]}]}},
    ],
)
def test_a_malformed_answer_is_a_prometheus_error(prometheus: Playback, body: Any) -> None:
    prometheus.bodies = [body]
    with pytest.raises(PrometheusError):
        query_device_peak(prometheus.url, "ns", "job-.+", START, END)
