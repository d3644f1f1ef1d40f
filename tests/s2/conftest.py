"""Fixtures for the S2 face tests (seed 002): real Runnel server processes on
loopback ports, each with its own data directory. The server machinery is
tests/pylib/runnel_harness.py, shared with tests/extensions.

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

import sys
from pathlib import Path

import pytest

PYLIB = str(Path(__file__).resolve().parents[1] / "pylib")
if PYLIB not in sys.path:
    sys.path.insert(0, PYLIB)

import runnel_harness as harness  # noqa: E402
import s2lib as s2  # noqa: E402
from runnel_harness import (_server_log_on_failure, c, pytest_runtest_makereport,  # noqa: E402,F401
                            server, start_server)

SUITE = harness.Suite(url_env="S2_TESTS_URL", tmp_prefix="runnel-s2-")


@pytest.fixture(scope="session")
def runnel_suite():
    return SUITE


def pytest_report_header(config):
    target = SUITE.external_url or f"{harness.RUNNEL_BIN} (a server per module)"
    return [f"runnel: {target}"]


def pytest_sessionstart(session):
    SUITE.check_binary()


@pytest.fixture
def basin(c):
    """A fresh basin, created through the S2 account API with the default config."""
    return s2.Basin.create(c)


@pytest.fixture
def stream(basin):
    """The name of a fresh, empty stream in `basin`."""
    return basin.create_stream()
