"""The training-side reporter: measure a training run's peak VRAM and wall time, post it once at the end.

Use it around the training call::

    from scheduler.integrations.reporter import VramReporter
    with VramReporter():          # reads VRAMFIT_URL, VRAMFIT_DECISION_ID, VRAMFIT_TOKEN from the environment
        trainer.train()

It samples device memory with NVML (``pynvml``) in a background thread when that is installed, reads
``torch.cuda.max_memory_reserved/allocated`` when the training script has imported torch, measures wall time,
notices a CUDA out-of-memory exception (and lets it propagate: the job must still fail), and posts one JSON
report to ``POST /v1/actuals`` with retries. It never raises into the training job: every failure of its
own is logged and swallowed. It imports with the standard library only; torch and NVML are optional.

``hf_callback()`` and ``lightning_callback()`` build callbacks for Hugging Face ``Trainer`` and Lightning when
those packages import. An OOM raised inside ``Trainer.train()`` skips ``on_train_end``; wrap the call in the
reporter as above to report OOMs under Hugging Face (Lightning's ``on_exception`` sees them).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

log = logging.getLogger("vramfit.reporter")

OOM_MARKERS = ("CUDA out of memory", "CUDA error: out of memory", "OutOfMemoryError")


def mentions_cuda_oom(text: str) -> bool:
    """True when ``text`` (an exception message, a termination message) reports a CUDA out-of-memory error."""
    return any(marker in text for marker in OOM_MARKERS)


def is_cuda_oom(exc: BaseException | None) -> bool:
    """True for torch's CUDA out-of-memory errors, recognised without importing torch."""
    if exc is None:
        return False
    return type(exc).__name__ == "OutOfMemoryError" or mentions_cuda_oom(str(exc))


class NvmlSampler:
    """Polls device memory in use on every visible GPU; keeps the largest reading of any one device."""

    def __init__(self, interval_seconds: float = 0.5) -> None:
        self.interval_seconds = interval_seconds
        self.peak_bytes: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None
        self._handles: list[Any] = []

    def start(self) -> bool:
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception as exc:  # not installed, no driver, no GPU
            log.debug("NVML unavailable: %s", exc)
            return False
        self.sample()
        self._thread = threading.Thread(target=self._run, name="vramfit-nvml", daemon=True)
        self._thread.start()
        return True

    def sample(self) -> None:
        try:
            used = [int(self._nvml.nvmlDeviceGetMemoryInfo(h).used) for h in self._handles]
        except Exception as exc:
            log.debug("NVML read failed: %s", exc)
            return
        if used:
            self.peak_bytes = max(self.peak_bytes or 0, *used)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_seconds):
            self.sample()

    def stop(self) -> int | None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.interval_seconds + 1)
            self.sample()
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
        return self.peak_bytes


def torch_peaks() -> tuple[int | None, int | None]:
    """(max reserved, max allocated) over this process's CUDA devices, if the script imported torch."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None, None
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None, None
        devices = range(torch.cuda.device_count())
        reserved = max(int(torch.cuda.max_memory_reserved(d)) for d in devices)
        allocated = max(int(torch.cuda.max_memory_allocated(d)) for d in devices)
        return reserved, allocated
    except Exception as exc:
        log.debug("torch memory stats unavailable: %s", exc)
        return None, None


def post_json(url: str, body: dict[str, Any], token: str | None, timeout_seconds: float, attempts: int,
              backoff_seconds: float) -> bool:
    """POST with retries on connection errors, 429 and 5xx; give up at once on other 4xx and on a redirect, which is
    not followed (urllib would re-send the bearer token to the ``Location`` as a GET without the report, and count
    its answer as the report stored). Never raises."""
    from scheduler.integrations.forwarder import _NoRedirects

    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    opener = urllib.request.build_opener(_NoRedirects())
    for attempt in range(1, attempts + 1):
        try:
            request = urllib.request.Request(url, data=data, headers=headers, method="POST")
            with opener.open(request, timeout=timeout_seconds) as response:
                if 200 <= response.status < 300:
                    return True
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                log.warning("vramfit at %s answered %s, a redirect to %r: not followed; give the server's own address",
                            url, exc.code, exc.headers.get("Location"))
                return False
            detail = exc.read(500).decode(errors="replace")  # never the whole body
            if exc.code != 429 and exc.code < 500:
                log.warning("vramfit rejected the report (%s): %s", exc.code, detail)
                return False
            log.info("vramfit answered %s (attempt %d/%d)", exc.code, attempt, attempts)
        except Exception as exc:
            log.info("cannot reach vramfit at %s (attempt %d/%d): %s", url, attempt, attempts, exc)
        if attempt < attempts:
            time.sleep(backoff_seconds * 2 ** (attempt - 1))
    log.warning("gave up reporting to vramfit after %d attempts", attempts)
    return False


def _env_token() -> str | None:
    token = os.environ.get("VRAMFIT_TOKEN")
    path = os.environ.get("VRAMFIT_TOKEN_FILE")
    if not token and path:
        try:
            token = Path(path).read_text().strip()
        except OSError as exc:
            log.warning("cannot read VRAMFIT_TOKEN_FILE: %s", exc)
    return token or None


class VramReporter:
    """Measures one training run and reports it once. Arguments default to ``VRAMFIT_*`` variables."""

    def __init__(
        self,
        url: str | None = None,
        decision_id: str | None = None,
        token: str | None = None,
        namespace: str | None = None,
        name: str | None = None,
        kind: str | None = None,
        sample_interval_seconds: float = 0.5,
        timeout_seconds: float = 5.0,
        attempts: int = 5,
        backoff_seconds: float = 1.0,
        budget_seconds: float = 10.0,
    ) -> None:
        env = os.environ
        self.url = url or env.get("VRAMFIT_URL")
        self.decision_id = decision_id or env.get("VRAMFIT_DECISION_ID")
        self.token = token or _env_token()
        self.namespace = namespace or env.get("VRAMFIT_NAMESPACE")
        self.name = name or env.get("VRAMFIT_JOB_NAME")
        self.kind = kind or env.get("VRAMFIT_JOB_KIND")
        self.timeout_seconds = timeout_seconds
        self.attempts = attempts
        self.backoff_seconds = backoff_seconds
        # the most the training process waits for the report at its end, whatever the collector does (down,
        # silent, answering one byte at a time): the post runs in a daemon thread that is then abandoned
        self.budget_seconds = budget_seconds
        self._sampler = NvmlSampler(sample_interval_seconds)
        self._started: float | None = None
        self.report: dict[str, Any] | None = None

    def start(self) -> VramReporter:
        try:
            self._started = time.monotonic()
            self._sampler.start()
        except Exception as exc:
            log.warning("vramfit reporter could not start: %s", exc)
        return self

    def finish(self, oom: bool = False, exit_reason: str | None = None) -> dict[str, Any] | None:
        """Stop measuring and post the report (once; later calls return the first report)."""
        if self.report is not None:
            return self.report
        try:
            device_peak = self._sampler.stop()
            reserved, allocated = torch_peaks()
            runtime = time.monotonic() - self._started if self._started is not None else None
            body: dict[str, Any] = {
                "peak_vram_bytes": device_peak,
                "peak_reserved_bytes": reserved,
                "peak_allocated_bytes": allocated,
                "runtime_seconds": runtime,
                "oom": oom,
                "exit_reason": exit_reason or ("CudaOOM" if oom else "Completed"),
                "source": "reporter",
            }
            if self.decision_id:
                body["decision_id"] = self.decision_id
            else:
                body.update(namespace=self.namespace, name=self.name, kind=self.kind)
            self.report = body
            if not self.url:
                log.warning("VRAMFIT_URL is not set; the report is not sent: %s", json.dumps(body))
            else:
                poster = threading.Thread(
                    target=post_json, name="vramfit-report", daemon=True,
                    args=(self.url.rstrip("/") + "/v1/actuals", body, self.token, self.timeout_seconds,
                          self.attempts, self.backoff_seconds))
                poster.start()
                poster.join(self.budget_seconds)
                if poster.is_alive():
                    log.warning("vramfit report not confirmed within %.0f s; the job goes on without it",
                                self.budget_seconds)
        except Exception as exc:
            log.warning("vramfit reporter failed: %s", exc)
        return self.report

    def __enter__(self) -> VramReporter:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        oom = is_cuda_oom(exc)
        if isinstance(exc, SystemExit) and exc.code in (None, 0):  # sys.exit() / sys.exit(0): a finished run
            exc = None
        reason = None if exc is None else ("CudaOOM" if oom else type(exc).__name__)
        self.finish(oom=oom, exit_reason=reason)
        return False  # the training job's own exception propagates unchanged


def hf_callback(reporter: VramReporter | None = None) -> Any:
    """A ``transformers.TrainerCallback`` that starts the reporter at train begin and reports at train end."""
    from transformers import TrainerCallback  # type: ignore[import-not-found]

    rep = reporter or VramReporter()

    class VramfitCallback(TrainerCallback):  # type: ignore[misc]
        reporter = rep

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            rep.start()

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            rep.finish()

    return VramfitCallback()


def lightning_callback(reporter: VramReporter | None = None) -> Any:
    """A Lightning ``Callback``: starts at fit start, reports at fit end or on an exception (OOM included)."""
    try:
        from lightning.pytorch.callbacks import Callback  # type: ignore[import-not-found]
    except ImportError:
        from pytorch_lightning.callbacks import Callback  # type: ignore[import-not-found]

    rep = reporter or VramReporter()

    class VramfitCallback(Callback):  # type: ignore[misc]
        reporter = rep

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            rep.start()

        def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
            rep.finish()

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            oom = is_cuda_oom(exception)
            rep.finish(oom=oom, exit_reason="CudaOOM" if oom else type(exception).__name__)

    return VramfitCallback()
