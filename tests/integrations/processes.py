"""Real processes on loopback for the end-to-end tests: ``vramfit serve``, Prometheus, a fake DCGM exporter.

Every wait is bounded; every process is stopped by the fixture that started it.
"""

from __future__ import annotations

import http.server
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
NO_PROMETHEUS = "the `prometheus` binary is not installed (apt-get install prometheus; CI installs it)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], Any], timeout_seconds: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_seconds
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except (httpx.HTTPError, OSError) as exc:
            last = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout_seconds} s waiting for {what}; last: {last!r}")


def stop_process(proc: subprocess.Popen[bytes], grace_seconds: float = 20) -> None:
    """Terminate a process we started, then kill it if it does not exit in time."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_seconds)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class ServeProcess:
    """``vramfit serve`` as a subprocess on 127.0.0.1."""

    def __init__(self, ledger: Path, log: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log.open("ab")
        code = "import sys; from scheduler.cli import main; sys.exit(main())"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, "serve", "--host", "127.0.0.1", "--port", str(self.port),
             "--ledger", str(ledger)],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        wait_until(self._healthy, 30, f"vramfit serve on {self.url}")

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"vramfit serve exited with {self.proc.returncode}")
        return httpx.get(self.url + "/healthz", timeout=1).status_code == 200

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


class PrometheusProcess:
    """A real Prometheus server on 127.0.0.1 scraping ``targets`` (job name -> host:port) every second."""

    def __init__(self, workdir: Path, targets: dict[str, str]) -> None:
        assert PROMETHEUS, NO_PROMETHEUS
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        jobs = "".join(
            f"  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n"
            for job, target in targets.items()
        )
        config = workdir / "prometheus.yml"
        config.write_text(f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n{jobs}")
        self.log = (workdir / "prometheus.log").open("ab")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        wait_until(lambda: httpx.get(self.url + "/-/ready", timeout=1).status_code == 200, 60, "Prometheus ready")

    def query(self, promql: str) -> list[dict[str, Any]]:
        r = httpx.get(self.url + "/api/v1/query", params={"query": promql}, timeout=5)
        r.raise_for_status()
        return list(r.json()["data"]["result"])

    def scalar(self, promql: str) -> float | None:
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else None

    def wait_for(self, promql: str, expected: float, timeout_seconds: float = 30) -> float:
        return float(wait_until(lambda: self.scalar(promql) == expected, timeout_seconds,
                                f"{promql} == {expected}", interval=0.25) and expected)

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


def serve_get(respond: Callable[[], tuple[bytes, str]]) -> http.server.ThreadingHTTPServer:
    """A loopback HTTP server (started in a daemon thread) answering every GET with ``respond()``'s body and
    content type."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body, content_type = respond()
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class FakeDcgmExporter:
    """Serves ``DCGM_FI_DEV_FB_USED`` (MiB) like the DCGM exporter, with values the test sets at any time."""

    def __init__(self) -> None:
        self.values_mib: dict[tuple[str, str, str], float] = {}  # (namespace, pod, gpu) -> MiB
        self.lock = threading.Lock()
        self.server = serve_get(self._exposition)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"

    def _exposition(self) -> tuple[bytes, str]:
        with self.lock:
            lines = ["# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).",
                     "# TYPE DCGM_FI_DEV_FB_USED gauge"]
            for (ns, pod, gpu), mib in self.values_mib.items():
                lines.append(f'DCGM_FI_DEV_FB_USED{{gpu="{gpu}",UUID="GPU-{gpu}-test",'
                             f'modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",container="trainer",'
                             f'namespace="{ns}",pod="{pod}"}} {mib}')
        return ("\n".join(lines) + "\n").encode(), "text/plain; version=0.0.4"

    def set(self, namespace: str, pod: str, gpu: str, mib: float) -> None:
        with self.lock:
            self.values_mib[(namespace, pod, gpu)] = mib

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
