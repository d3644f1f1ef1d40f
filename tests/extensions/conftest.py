"""Fixtures for the seed 000 extension tests: real Runnel server processes on
loopback ports, each with its own data directory. The server machinery is
tests/pylib/runnel_harness.py, shared with tests/s2.

    RUNNEL_BIN       server binary (default: <repo>/target/release/runnel)
    EXTENSIONS_URL   test an already running server instead of starting one;
                     tests that need a restart, a SIGKILL or extra flags skip

Fixtures:
    server        one server per test module (tests keep to their own buckets)
    fresh_server  a new server for this test alone (clean state, restartable)
    start_server  factory: start_server("--max-body-bytes", "4096") -> Server
    c             an httpx.Client on `server`
    bucket        a new, uniquely named bucket on `server`
"""

import sys
from pathlib import Path

import pytest

PYLIB = str(Path(__file__).resolve().parents[1] / "pylib")
if PYLIB not in sys.path:
    sys.path.insert(0, PYLIB)

import helpers  # noqa: E402
import runnel_harness as harness  # noqa: E402
from runnel_harness import (_server_log_on_failure, c, pytest_runtest_makereport,  # noqa: E402,F401
                            server, start_server)

SUITE = harness.Suite(url_env="EXTENSIONS_URL", tmp_prefix="runnel-ext-")


@pytest.fixture(scope="session")
def runnel_suite():
    return SUITE


def pytest_report_header(config):
    target = SUITE.external_url or f"{harness.RUNNEL_BIN} (a server per module / per test)"
    return [f"runnel: {target}", f"random seed: {helpers.SEED} (set EXTENSIONS_SEED to repeat)"]


def pytest_sessionstart(session):
    SUITE.check_binary()


@pytest.fixture
def fresh_server(start_server):
    return start_server()


@pytest.fixture
def bucket(c):
    return helpers.create_bucket(c)
