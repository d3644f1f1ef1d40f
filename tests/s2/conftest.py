"""Fixtures for the S2 face tests (seed 002): real Runnel server processes on
loopback ports, each with its own data directory. The server machinery is the
one of tests/extensions/conftest.py (copied, so the two suites stay apart).

    RUNNEL_BIN    server binary (default: <repo>/target/release/runnel)
    S2_TESTS_URL  test an already running server instead of starting one;
                  tests that need a server of their own skip

Fixtures:
    server        one server per test module (tests keep to their own basins)
    start_server  factory: start_server("--max-body-bytes", "4096") -> Server
    c             an httpx.Client on `server`
    basin         a new basin (made through POST /v1/basins), as an s2.Basin
    stream        the name of a new stream in `basin` (POST /v1/streams)
"""

import os
import queue
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

import httpx
import pytest

import s2lib as s2

REPO_ROOT = Path(__file__).resolve().parents[2]
RUNNEL_BIN = os.environ.get("RUNNEL_BIN") or str(REPO_ROOT / "target" / "release" / "runnel")
EXTERNAL_URL = os.environ.get("S2_TESTS_URL", "").rstrip("/")

# The one line the server prints on stdout once it accepts connections.
LISTENING = re.compile(r"^runnel listening on (127\.0\.0\.1:\d+)$")
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _die_with_parent():
    """Runs in the child before exec: SIGKILL it if pytest dies (Linux)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Server:
    """A `runnel serve` process on 127.0.0.1, on a port the OS picks."""

    def __init__(self, data_dir, extra_args=()):
        self.data_dir = Path(data_dir)
        self.extra_args = list(extra_args)
        self.log_path = self.data_dir.parent / (self.data_dir.name + ".log")
        self.proc = None
        self.url = None
        self.port = None
        self._clients = []
        self._reader = None

    def start(self):
        assert self.proc is None, "server already running"
        args = [RUNNEL_BIN, "serve", "--listen", "127.0.0.1:0",
                "--data-dir", str(self.data_dir), "--long-poll-timeout-ms", "500",
                *self.extra_args]
        # Flags have RUNNEL_* environment twins: keep the caller's out of it.
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNEL_")}
        env["NO_COLOR"] = "1"
        log = open(self.log_path, "ab")
        log.write(f"--- start: {' '.join(args)}\n".encode())
        log.flush()
        try:
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=log, env=env, preexec_fn=_die_with_parent)
        finally:
            log.close()
        lines = queue.Queue()
        proc = self.proc

        def pump():
            # First stdout line to the queue, everything (incl. it) to the log.
            with open(self.log_path, "ab") as out:
                for raw in proc.stdout:
                    out.write(b"[stdout] " + raw)
                    out.flush()
                    lines.put(raw.decode("utf-8", "replace").rstrip("\r\n"))
            lines.put(None)

        self._reader = threading.Thread(target=pump, daemon=True)
        self._reader.start()
        try:
            first = lines.get(timeout=START_TIMEOUT_S)
        except queue.Empty:
            self.kill()
            raise RuntimeError(f"server printed no address within {START_TIMEOUT_S:.0f} s\n"
                               + self.log_tail())
        m = LISTENING.match(first or "")
        if not m:
            self.kill()
            raise RuntimeError(f"unexpected first stdout line from the server: {first!r}\n"
                               + self.log_tail())
        self.url = f"http://{m.group(1)}"
        self.port = int(m.group(1).rsplit(":", 1)[1])
        return self

    def _wait(self, timeout):
        try:
            self.proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def stop(self):
        """Graceful stop (SIGTERM, then SIGKILL after STOP_TIMEOUT_S)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            if not self._wait(STOP_TIMEOUT_S):
                self.proc.kill()
                self._wait(STOP_TIMEOUT_S)
        self._finish()

    def kill(self):
        """SIGKILL: no shutdown code runs."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self._wait(STOP_TIMEOUT_S)
        self._finish()

    def _finish(self):
        if self._reader is not None:
            self._reader.join(timeout=STOP_TIMEOUT_S)
        if self.proc.stdout:
            self.proc.stdout.close()
        self.proc = None
        self.url = None

    def client(self, **kwargs):
        """An httpx.Client on this server."""
        kwargs.setdefault("timeout", s2.WAIT_S)
        client = httpx.Client(base_url=self.url, **kwargs)
        self._clients.append(client)
        return client

    def log_tail(self, n=40):
        try:
            text = self.log_path.read_text("utf-8", "replace")
        except OSError:
            return "(no server log)"
        lines = ANSI.sub("", text).splitlines()[-n:]
        return f"--- last {len(lines)} lines of {self.log_path} ---\n" + "\n".join(lines)

    def close_clients(self):
        for client in self._clients:
            client.close()
        self._clients.clear()


class ExternalServer(Server):
    """A server someone else runs (S2_TESTS_URL)."""

    def __init__(self, url):
        super().__init__(tempfile.gettempdir() + "/external")
        self.url = url
        self.port = httpx.URL(url).port

    def start(self):
        return self

    def stop(self):
        pass

    def kill(self):
        pytest.skip("needs a server this suite starts (S2_TESTS_URL is set)")

    def log_tail(self, n=40):
        return "(external server: no log)"


_live_servers = []


def _new_server(extra_args=()):
    root = tempfile.mkdtemp(prefix="runnel-s2-")
    srv = Server(Path(root) / "data", extra_args)
    srv.root = root
    _live_servers.append(srv)
    return srv.start()


def _dispose(srv):
    srv.close_clients()
    srv.stop()
    if srv in _live_servers:
        _live_servers.remove(srv)
    shutil.rmtree(getattr(srv, "root", ""), ignore_errors=True)


def pytest_report_header(config):
    target = EXTERNAL_URL or f"{RUNNEL_BIN} (a server per module)"
    return [f"runnel: {target}"]


def pytest_sessionstart(session):
    if not EXTERNAL_URL and not os.access(RUNNEL_BIN, os.X_OK):
        raise pytest.UsageError(f"no server binary at {RUNNEL_BIN} "
                                "(build it, or set RUNNEL_BIN or S2_TESTS_URL)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


@pytest.fixture(autouse=True)
def _server_log_on_failure(request):
    """On a failed test, print the end of every running server's log."""
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for srv in list(_live_servers):
            print(srv.log_tail())


@pytest.fixture(scope="module")
def server():
    if EXTERNAL_URL:
        yield ExternalServer(EXTERNAL_URL)
        return
    srv = _new_server()
    yield srv
    _dispose(srv)


@pytest.fixture
def start_server():
    """Factory for servers of this test alone, e.g. with extra flags."""
    if EXTERNAL_URL:
        pytest.skip("needs a server this suite starts (S2_TESTS_URL is set)")
    started = []

    def start(*extra_args):
        srv = _new_server(extra_args)
        started.append(srv)
        return srv

    yield start
    for srv in started:
        _dispose(srv)


@pytest.fixture
def c(server):
    client = server.client()
    yield client
    client.close()


@pytest.fixture
def basin(c):
    """A fresh basin, created through the S2 account API with the default config."""
    return s2.Basin.create(c)


@pytest.fixture
def stream(basin):
    """The name of a fresh, empty stream in `basin`."""
    return basin.create_stream()
