from __future__ import annotations

import subprocess
import sys
import threading
import time
import types
from typing import Any

import pytest

from scheduler.integrations.records import ActualIn
from scheduler.integrations.reporter import VramReporter, hf_callback, is_cuda_oom, lightning_callback
from tests.integrations.processes import free_port
from tests.integrations.stub_http import StubHttpServer


def Collector(failures: int = 0, status: int = 202) -> StubHttpServer:
    """The first ``failures`` posts get 503, then ``status``."""
    return StubHttpServer([503] * failures, default_status=status)


@pytest.fixture
def collector():  # type: ignore[no-untyped-def]
    c = Collector(failures=2)
    yield c
    c.stop()


def fast(url: str, **kw: Any) -> VramReporter:
    return VramReporter(url=url, decision_id="d1", timeout_seconds=2, attempts=3, backoff_seconds=0.01, **kw)


def test_imports_and_reports_without_torch_or_nvml():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['pynvml'] = None\n"
            "from scheduler.integrations.reporter import VramReporter\n"
            "r = VramReporter(url=None, decision_id='d'); r.start(); print(r.finish()['runtime_seconds'] >= 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


def test_posts_once_with_retries_and_a_valid_actual(collector, monkeypatch):
    monkeypatch.setenv("VRAMFIT_TOKEN", "tok")
    with fast(collector.url):
        time.sleep(0.05)
    assert len(collector.bodies) == 3  # two 503s, then accepted
    body = collector.bodies[-1]
    assert body["runtime_seconds"] >= 0.05 and body["oom"] is False and body["exit_reason"] == "Completed"
    assert collector.headers[-1]["Authorization"] == "Bearer tok"
    ActualIn.model_validate(body)  # what the server will accept


def test_cuda_oom_is_reported_and_still_raised(collector):
    class OutOfMemoryError(RuntimeError):
        pass

    reporter = fast(collector.url)
    with pytest.raises(OutOfMemoryError), reporter:
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert reporter.report is not None and reporter.report["oom"] is True
    assert collector.bodies[-1]["exit_reason"] == "CudaOOM"
    assert reporter.finish() is reporter.report and len(collector.bodies) == 3  # posted once


@pytest.mark.parametrize(
    ("exc", "expected"),
    [(RuntimeError("CUDA error: out of memory"), True), (MemoryError("host"), False), (ValueError("x"), False),
     (None, False)],
)
def test_is_cuda_oom(exc, expected):
    assert is_cuda_oom(exc) is expected


def test_never_raises_when_vramfit_is_unreachable():
    reporter = VramReporter(url=f"http://127.0.0.1:{free_port()}", decision_id="d1", timeout_seconds=0.5,
                            attempts=2, backoff_seconds=0.01)
    with reporter:
        pass
    assert reporter.report is not None


def test_a_rejected_report_is_not_retried():
    c = Collector(status=422)
    try:
        with fast(c.url):
            pass
        assert len(c.bodies) == 1
    finally:
        c.stop()


def test_reads_torch_and_nvml_when_present(collector, monkeypatch):
    cuda = types.SimpleNamespace(
        is_available=lambda: True, is_initialized=lambda: True, device_count=lambda: 2,
        max_memory_reserved=lambda d: [5, 7][d] * 2**30, max_memory_allocated=lambda d: [4, 6][d] * 2**30)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    readings = iter([1, 9, 3] + [2] * 1000)
    nvml = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=next(readings) * 2**30))
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with fast(collector.url, sample_interval_seconds=0.01):
        time.sleep(0.2)
    body = collector.bodies[-1]
    assert body["peak_vram_bytes"] == 9 * 2**30
    assert body["peak_reserved_bytes"] == 7 * 2**30 and body["peak_allocated_bytes"] == 6 * 2**30


def test_callbacks_when_the_frameworks_import(collector, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(TrainerCallback=object))
    cb = hf_callback(fast(collector.url))
    cb.on_train_begin(None, None, None)
    cb.on_train_end(None, None, None)
    assert collector.bodies[-1]["oom"] is False

    callbacks = types.ModuleType("lightning.pytorch.callbacks")
    callbacks.Callback = object  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lightning", types.ModuleType("lightning"))
    monkeypatch.setitem(sys.modules, "lightning.pytorch", types.ModuleType("lightning.pytorch"))
    monkeypatch.setitem(sys.modules, "lightning.pytorch.callbacks", callbacks)
    lcb = lightning_callback(fast(collector.url))
    lcb.on_fit_start(None, None)
    lcb.on_exception(None, None, RuntimeError("CUDA out of memory"))
    assert collector.bodies[-1]["oom"] is True


def test_a_collector_that_never_answers_holds_the_job_no_longer_than_the_budget(
        caplog: pytest.LogCaptureFixture) -> None:
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections (the kernel does) and never answers: each attempt waits its timeout
    try:
        reporter = VramReporter(url=f"http://127.0.0.1:{silent.getsockname()[1]}", decision_id="d1",
                                timeout_seconds=5, attempts=5, backoff_seconds=1, budget_seconds=1)
        with caplog.at_level("WARNING"), reporter:
            pass
        # the job went on when the budget ran out, with the post still waiting (5 x 5 s + backoff without it)
        assert reporter.report is not None
        assert any("not confirmed within 1 s" in r.getMessage() for r in caplog.records)
        assert any(t.name == "vramfit-report" and t.is_alive() for t in threading.enumerate())
    finally:
        silent.close()


def test_sys_exit_0_inside_the_block_is_a_finished_run(collector):
    reporter = fast(collector.url)
    with pytest.raises(SystemExit), reporter:
        raise SystemExit(0)
    assert reporter.report is not None and reporter.report["exit_reason"] == "Completed"
    failed = fast(collector.url)
    with pytest.raises(SystemExit), failed:
        raise SystemExit(3)
    assert failed.report is not None and failed.report["exit_reason"] == "SystemExit"
