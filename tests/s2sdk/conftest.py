"""Fixtures for the Python S2 SDK tests: the official SDK (PyPI `s2-sdk`,
module `s2_sdk`) against a real server on a loopback port. The SDK speaks
HTTP/2 only (prior knowledge for http:// endpoints), JSON for the control
plane, protobuf for unary appends and reads, and S2S for sessions. The server
machinery is tests/pylib/runnel_harness.py, shared with tests/s2 and
tests/extensions.

    RUNNEL_BIN       server binary (default: <repo>/target/release/runnel)
    S2SDK_TESTS_URL  test an already running server (Runnel, or s2-lite, the
                     reference) instead of starting one; tests that need a
                     server of their own skip

Fixtures:
    server      one server per test module (tests keep to their own basins)
    new_client  factory: new_client(compression=Compression.ZSTD) -> s2_sdk.S2
                on `server` (closed after the test)
    s2          an s2_sdk.S2 on `server`: account and basin endpoints both the
                server URL (so the SDK sends `s2-basin`), token "ignored", no
                retries (a server error or dropped connection fails the test
                instead of being retried away), 10 s request timeout
    basin       a fresh basin (S2.create_basin, default config), as S2Basin
    stream      a fresh, empty stream in `basin` (create_stream), as S2Stream
"""

import asyncio
import gc
import sys
from datetime import timedelta
from pathlib import Path

import pytest

PYLIB = str(Path(__file__).resolve().parents[1] / "pylib")
if PYLIB not in sys.path:
    sys.path.insert(0, PYLIB)

import runnel_harness as harness  # noqa: E402
from runnel_harness import (_server_log_on_failure, pytest_runtest_makereport,  # noqa: E402,F401
                            server, start_server)
from s2_sdk import S2, Compression, Endpoints, Retry, Timeout  # noqa: E402

from sdklib import WAIT_S, unique_basin, unique_stream, within  # noqa: E402

SUITE = harness.Suite(url_env="S2SDK_TESTS_URL", tmp_prefix="runnel-s2sdk-")

TOKEN = "ignored"


@pytest.fixture(scope="session")
def runnel_suite():
    return SUITE


def pytest_report_header(config):
    target = SUITE.external_url or f"{harness.RUNNEL_BIN} (a server per module)"
    return [f"runnel: {target}"]


def pytest_sessionstart(session):
    SUITE.check_binary()


@pytest.fixture(autouse=True)
def _collect_garbage():
    """A garbage collection after each test, while nothing else runs. The
    SDK's tasks and async generators of a failed session die with the test's
    event loop; collected later, at a random allocation, their finalizers
    can land inside pytest's own ast.parse while it renders a failure, which
    CPython 3.11.7 reports as "SystemError: AST constructor recursion depth
    mismatch" and pytest as an INTERNALERROR that ends the run."""
    yield
    gc.collect()


def make_client(url, compression=Compression.NONE, max_attempts=1):
    return S2(TOKEN, endpoints=Endpoints(url, url),
              timeout=Timeout(request=timedelta(seconds=WAIT_S), connection=timedelta(seconds=5)),
              retry=Retry(max_attempts=max_attempts), compression=compression)


@pytest.fixture
async def new_client(server):
    """Factory for more SDK clients on `server` (each with its own HTTP/2
    connection pool); they are closed after the test."""
    made = []

    def new(**kwargs):
        client = make_client(server.url, **kwargs)
        made.append(client)
        return client

    yield new
    for client in made:
        try:
            await asyncio.wait_for(client.close(), WAIT_S)
        except Exception:
            pass


@pytest.fixture
async def s2(new_client):
    return new_client()


@pytest.fixture
async def basin(s2):
    """A fresh basin with the default config; deleted (best effort) afterwards."""
    name = unique_basin()
    await within(s2.create_basin(name), what="create_basin")
    yield s2.basin(name)
    try:
        await asyncio.wait_for(s2.delete_basin(name, ignore_not_found=True), WAIT_S)
    except Exception:
        pass


@pytest.fixture
async def stream(basin):
    """A fresh, empty stream in `basin`."""
    name = unique_stream()
    await within(basin.create_stream(name), what="create_stream")
    return basin.stream(name)
