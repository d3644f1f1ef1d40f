"""Helpers shared by the Python S2 SDK tests: names, records, bounded waits
around SDK calls, and readers that drain unary reads and read sessions with a
deadline. Everything here uses the SDK's public API (`s2_sdk`) only.

Every wait is bounded: `within` turns a slow await into an AssertionError
after WAIT_S, `take` / `drain` do the same for read sessions, and pytest-timeout
(pytest.ini) is the backstop behind them.
"""

import asyncio
import time
import uuid
from contextlib import asynccontextmanager

from s2_sdk import (AppendInput, ReadUnwrittenError, Record, SeqNum, metered_bytes)

# How long to wait for something the server should do promptly.
WAIT_S = 10.0
MIB = 1024 * 1024


# --- names -------------------------------------------------------------------

def unique_basin(prefix="sdk"):
    """A fresh basin name: 8-48 chars of [a-z0-9-], alphanumeric at both ends."""
    return f"{prefix}{uuid.uuid4().hex[:16]}"


def unique_stream(prefix="s"):
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


# --- records -----------------------------------------------------------------

def _b(x):
    return x.encode() if isinstance(x, str) else x


def rec(body=b"", headers=(), timestamp=None):
    """A Record; str bodies and header names/values are UTF-8 encoded."""
    return Record(body=_b(body), headers=[(_b(n), _b(v)) for n, v in headers],
                  timestamp=timestamp)


def recs(*bodies):
    return [rec(b) for b in bodies]


def batch(*records, **kwargs):
    """An AppendInput of Records (or of bodies, which become Records)."""
    return AppendInput(records=[r if isinstance(r, Record) else rec(r) for r in records],
                       **kwargs)


def bodies(records):
    return [r.body for r in records]


def seq_nums(records):
    return [r.seq_num for r in records]


def now_ms():
    return int(time.time() * 1000)


def metered(records):
    return metered_bytes(records)


# --- bounded waits -----------------------------------------------------------

async def within(aw, timeout=WAIT_S, what="the call"):
    """Awaits `aw`, failing the test if it takes longer than `timeout` s."""
    try:
        return await asyncio.wait_for(aw, timeout)
    except TimeoutError:
        raise AssertionError(f"{what} did not complete within {timeout} s") from None


@asynccontextmanager
async def opened(session, timeout=WAIT_S):
    """`async with opened(stream.append_session()) as s:` - like the SDK's own
    context manager (close() on exit: flush, wait for every ack, end the
    session), but with close() bounded. When the body failed, an error from
    close() is dropped in favour of the body's."""
    try:
        yield session
    except BaseException:
        try:
            await asyncio.wait_for(session.close(), timeout)
        except BaseException:
            pass
        raise
    await within(session.close(), timeout, what="closing the session")


async def append(stream, *records, **kwargs):
    """One unary append of `records` (Records or bodies); returns the AppendAck."""
    return await within(stream.append(batch(*records, **kwargs)), what="append")


async def read(stream, **kwargs):
    """One unary read (S2Stream.read keyword arguments); returns the ReadBatch."""
    return await within(stream.read(**kwargs), what="read")


async def read_all(stream, start=0, max_rounds=200):
    """Every record from seq_num `start` up to the tail, by unary reads."""
    out = []
    for _ in range(max_rounds):
        try:
            got = await read(stream, start=SeqNum(start))
        except ReadUnwrittenError:
            return out
        if not got.records:
            return out
        out.extend(got.records)
        start = got.records[-1].seq_num + 1
    raise AssertionError(f"stream still had records after {max_rounds} reads")


async def _next(session, deadline, what):
    remaining = deadline - asyncio.get_running_loop().time()
    if remaining <= 0:
        raise AssertionError(f"{what}: deadline passed")
    try:
        return await asyncio.wait_for(session.__anext__(), remaining)
    except TimeoutError:
        raise AssertionError(f"{what}: nothing within the deadline") from None


async def take(session, n, timeout=WAIT_S):
    """Records from a read session until at least `n` have arrived; fails if
    the session ends first or they do not arrive within `timeout` s."""
    got = []
    deadline = asyncio.get_running_loop().time() + timeout
    while len(got) < n:
        try:
            b = await _next(session, deadline, f"read session ({len(got)}/{n} records)")
        except StopAsyncIteration:
            raise AssertionError(f"read session ended after {len(got)} of {n} records") from None
        got.extend(b.records)
    return got


async def drain(session, timeout=WAIT_S):
    """Every record a read session yields until it ends by itself, which must
    happen within `timeout` s."""
    got = []
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            b = await _next(session, deadline, f"read session did not end ({len(got)} records)")
        except StopAsyncIteration:
            return got
        got.extend(b.records)


async def eventually(probe, timeout=WAIT_S, interval=0.05, what="condition"):
    """Polls the coroutine function `probe` until it returns a truthy value
    (returned) or `timeout` s pass (AssertionError with the last value). For
    server effects that are eventual by specification (trim, deletion)."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = await within(probe(), what=what)
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} did not hold within {timeout} s (last: {last!r})")
        await asyncio.sleep(interval)
