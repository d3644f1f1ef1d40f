"""The harness the black-box pytest suites (tests/extensions, tests/s2) share:
real `runnel serve` processes on loopback ports, each with its own data
directory; the pytest fixtures and hooks around them; and the response checks
and SSE reader both suites use.

    RUNNEL_BIN   server binary (default: <repo>/target/release/runnel)

A suite's conftest.py puts this directory on sys.path, describes itself with a
Suite (the variable that names an already running server, the prefix of its
temporary dirs), hands that to the shared fixtures through a `runnel_suite`
fixture and imports them into its own namespace:

    SUITE = runnel_harness.Suite(url_env="EXTENSIONS_URL", tmp_prefix="runnel-ext-")

    @pytest.fixture(scope="session")
    def runnel_suite():
        return SUITE

    from runnel_harness import c, server, start_server, ...

Fixtures:
    server        one server per test module
    start_server  factory: start_server("--max-body-bytes", "4096") -> Server
    c             an httpx.Client on `server`
and, autouse, the end of every running server's log after a failed test.
"""

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
RUNNEL_BIN = os.environ.get("RUNNEL_BIN") or str(REPO_ROOT / "target" / "release" / "runnel")

# How long to wait for something the server should do promptly.
WAIT_S = 10.0

OCTET = "application/octet-stream"
JSON_CT = "application/json"
TEXT = "text/plain"
SSE_CT = "text/event-stream"

# The one line the server prints on stdout once it accepts connections.
LISTENING = re.compile(r"^runnel listening on (127\.0\.0\.1:\d+)$")
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0
ANSI = re.compile(r"\x1b\[[0-9;]*m")


# --- server processes -------------------------------------------------------

def _die_with_parent():
    """Runs in the child before exec: SIGKILL it if pytest dies (Linux)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Server:
    """A `runnel serve` process on 127.0.0.1. `url` (and `port`) change on every
    (re)start, since each start listens on a port the OS picks; clients made by
    `client()` follow."""

    restartable = True

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
        for client in self._clients:
            if not client.is_closed:
                client.base_url = self.url
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

    def restart(self, kill=True):
        """SIGKILL (or graceful stop) and start again on the same data dir."""
        self.kill() if kill else self.stop()
        return self.start()

    def client(self, **kwargs):
        """An httpx.Client on this server; it follows the server across restarts."""
        kwargs.setdefault("timeout", WAIT_S)
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
    """A server someone else runs (the suite's URL variable is set): no
    restarts, no SIGKILL, no flags."""

    restartable = False

    def __init__(self, url, url_env):
        super().__init__(tempfile.gettempdir() + "/external")
        self.url = url
        self.port = httpx.URL(url).port
        self.url_env = url_env

    def start(self):
        return self

    def stop(self):
        pass

    def kill(self):
        pytest.skip(f"needs a server this suite starts ({self.url_env} is set)")

    def restart(self, kill=True):
        pytest.skip(f"needs a server this suite starts ({self.url_env} is set)")

    def log_tail(self, n=40):
        return "(external server: no log)"


class Suite:
    """One pytest suite's servers: `url_env` names the variable that points the
    suite at an already running server instead; each server this suite starts
    gets a temporary dir named `tmp_prefix`..., removed when it is disposed of."""

    def __init__(self, url_env, tmp_prefix):
        self.url_env = url_env
        self.tmp_prefix = tmp_prefix
        self.external_url = os.environ.get(url_env, "").rstrip("/")
        self.live = []

    def new_server(self, extra_args=()):
        root = tempfile.mkdtemp(prefix=self.tmp_prefix)
        srv = Server(Path(root) / "data", extra_args)
        srv.root = root
        self.live.append(srv)
        return srv.start()

    def dispose(self, srv):
        srv.close_clients()
        srv.stop()
        if srv in self.live:
            self.live.remove(srv)
        shutil.rmtree(getattr(srv, "root", ""), ignore_errors=True)

    def skip_if_external(self):
        if self.external_url:
            pytest.skip(f"needs a server this suite starts ({self.url_env} is set)")

    def check_binary(self):
        """For pytest_sessionstart: a usage error without a server to start."""
        if not self.external_url and not os.access(RUNNEL_BIN, os.X_OK):
            raise pytest.UsageError(f"no server binary at {RUNNEL_BIN} "
                                    f"(build it, or set RUNNEL_BIN or {self.url_env})")


# --- pytest hooks and fixtures (imported by each suite's conftest.py) --------

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


@pytest.fixture(autouse=True)
def _server_log_on_failure(request, runnel_suite):
    """On a failed test, print the end of every running server's log."""
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for srv in list(runnel_suite.live):
            print(srv.log_tail())


@pytest.fixture(scope="module")
def server(runnel_suite):
    if runnel_suite.external_url:
        yield ExternalServer(runnel_suite.external_url, runnel_suite.url_env)
        return
    srv = runnel_suite.new_server()
    yield srv
    runnel_suite.dispose(srv)


@pytest.fixture
def start_server(runnel_suite):
    """Factory for servers of this test alone, e.g. with extra flags."""
    runnel_suite.skip_if_external()
    started = []

    def start(*extra_args):
        srv = runnel_suite.new_server(extra_args)
        started.append(srv)
        return srv

    yield start
    for srv in started:
        runnel_suite.dispose(srv)


@pytest.fixture
def c(server):
    client = server.client()
    yield client
    client.close()


# --- checks -----------------------------------------------------------------

def describe(r):
    try:
        body = r.content[:400]
    except httpx.ResponseNotRead:
        body = "(body not read)"
    return (f"{r.request.method} {r.request.url} -> {r.status_code}\n"
            f"request headers: {dict(r.request.headers)}\n"
            f"headers: {dict(r.headers)}\nbody: {body!r}")


def media_type(value):
    return (value or "").split(";")[0].strip().lower()


def check(r, status):
    """Asserts the status (an int or a tuple of acceptable ints); returns r."""
    ok = r.status_code in status if isinstance(status, tuple) else r.status_code == status
    assert ok, f"expected {status}\n{describe(r)}"
    return r


# --- SSE --------------------------------------------------------------------

@dataclass
class Event:
    type: str         # the event: field, "message" without one
    data: str         # the data: lines, joined by "\n"
    id: object = None  # the id: field, or None

    def json(self):
        return json.loads(self.data)


class SSE:
    """Reads an SSE response event by event, with bounded waits. A suite
    subclasses it for its own events (`event_class`) and shortcuts.

        with SSE(c, path, {"offset": "-1"}) as s:
            events = s.until(lambda e: e.type == "control")
    """

    event_class = Event

    def __init__(self, client, path, params=None, headers=None):
        self.client, self.path, self.params, self.headers = client, path, params, headers
        self.events = []

    def __enter__(self):
        self._cm = self.client.stream("GET", self.path, params=self.params, headers=self.headers,
                                      timeout=httpx.Timeout(WAIT_S))
        self.response = self._cm.__enter__()
        if self.response.status_code != 200:
            self.response.read()
        self._lines = self.response.iter_lines()
        return self

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)

    def expect_ok(self):
        r = self.response
        assert r.status_code == 200, describe(r)
        assert media_type(r.headers.get("content-type")) == SSE_CT, describe(r)
        return self

    def next_event(self):
        """The next event, or None at the end of the response."""
        etype, eid, data, seen = None, None, [], False
        for line in self._lines:
            if line == "":
                if seen:
                    ev = self.event_class(etype or "message", "\n".join(data), eid)
                    self.events.append(ev)
                    return ev
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if name == "event":
                etype, seen = value, True
            elif name == "data":
                data.append(value)
                seen = True
            elif name == "id":
                eid, seen = value, True
        return None

    def until(self, pred, timeout=WAIT_S):
        """Events read until pred(event) holds for one; fails on end or timeout."""
        got = []
        deadline = time.monotonic() + timeout
        while True:
            assert time.monotonic() < deadline, f"no matching SSE event within {timeout} s: {got}"
            ev = self.next_event()
            assert ev is not None, f"SSE response ended before a matching event: {got}"
            got.append(ev)
            if pred(ev):
                return got

    def rest(self, timeout=WAIT_S):
        """Every remaining event, up to the end of the response (which must come)."""
        got = []
        deadline = time.monotonic() + timeout
        while True:
            assert time.monotonic() < deadline, f"SSE response did not end within {timeout} s: {got}"
            ev = self.next_event()
            if ev is None:
                return got
            got.append(ev)
