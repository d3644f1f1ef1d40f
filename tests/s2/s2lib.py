"""Helpers shared by the S2 face tests: names and paths, a basin-bound request
helper, error and response checks, S2's metered size, an SSE reader for S2's
`batch` / `ping` / `error` / `[DONE]` events, and Durable Streams shortcuts
for the cross-face tests. The response checks and the SSE reader are
tests/pylib/runnel_harness.py's (shared with tests/extensions; conftest.py puts
it on sys.path)."""

import base64
import json
import struct
import threading
import time
import uuid
from urllib.parse import quote

import runnel_harness as harness
from runnel_harness import (JSON_CT, OCTET, SSE_CT, TEXT, WAIT_S, check, describe,  # noqa: F401
                            media_type)

MIB = 1024 * 1024
# Durable Streams offset of the start of a stream (ARCHITECTURE.md).
DS_START = "0000000000000000_0000000000000000"
U64_MAX = 2**64 - 1


# --- names and paths ----------------------------------------------------------

def unique_basin(prefix="t"):
    """A fresh S2 basin name (8-48 bytes of [a-z0-9-], letter or digit at both ends);
    also a valid Runnel bucket id."""
    return f"{prefix}{uuid.uuid4().hex[:15]}"


def unique_stream(prefix="s"):
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def seg(text):
    """Percent-encodes one path segment (every reserved character, '/' too; the
    dots of a "." or ".." segment too, which clients would otherwise resolve)."""
    out = quote(text, safe="")
    return out.replace(".", "%2E") if text and set(text) == {"."} else out


def basin_path(basin):
    return f"/v1/basins/{seg(basin)}"


def stream_path(stream):
    return f"/v1/streams/{seg(stream)}"


def records_path(stream):
    return f"/v1/streams/{seg(stream)}/records"


def tail_path(stream):
    return f"/v1/streams/{seg(stream)}/records/tail"


def ds_path(basin, stream):
    """The same stream on the bucketed Durable Streams face."""
    return f"/{basin}/{seg(stream)}"


# --- values -------------------------------------------------------------------

def now_ms():
    return int(time.time() * 1000)


def b64(data):
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def unb64(text):
    return base64.b64decode(text, validate=True)


def _bytes(x):
    return x.encode() if isinstance(x, str) else x


def metered(body=b"", headers=()):
    """S2's metered size of an ordinary record (s2-notes §1 "Metered size")."""
    return (8 + 2 * len(headers) + sum(len(_bytes(n)) + len(_bytes(v)) for n, v in headers)
            + len(_bytes(body)))


def fence_metered(token=""):
    return 8 + 2 + len("fence") + len(_bytes(token))


TRIM_METERED = 8 + 2 + len("trim") + 8


def rec(body=None, headers=None, timestamp=None):
    """One AppendRecord (JSON); fields left out when None."""
    r = {}
    if body is not None:
        r["body"] = body
    if headers is not None:
        r["headers"] = [list(h) for h in headers]
    if timestamp is not None:
        r["timestamp"] = timestamp
    return r


def fence(token=""):
    """A fence command record (s2-format raw)."""
    return {"headers": [["", "fence"]], "body": token}


def trim_b64(seq_num):
    """A trim command record; needs `s2-format: base64`."""
    return {"headers": [["", b64("trim")]], "body": b64(struct.pack(">Q", seq_num))}


def bodies(records):
    return [r.get("body", "") for r in records]


def seq_nums(records):
    return [r["seq_num"] for r in records]


# --- checks (describe, check, media_type: runnel_harness) ------------------------

def json_of(r, status=200):
    """Asserts the status and a JSON body; returns the decoded body."""
    check(r, status)
    assert media_type(r.headers.get("content-type")) == JSON_CT, describe(r)
    return r.json()


def expect_error(r, status, code):
    """An S2 error: the status, and a JSON ErrorInfo body {"code", "message"} with `code`."""
    body = json_of(r, status)
    assert isinstance(body, dict), describe(r)
    assert body.get("code") == code, f"expected code {code!r}\n{describe(r)}"
    assert isinstance(body.get("message"), str), f"ErrorInfo without a message\n{describe(r)}"
    return body


def subset(got, want, where="config"):
    """Asserts every key of `want` is in `got` with the same value (recursively for dicts)."""
    assert isinstance(got, dict), f"{where}: expected an object, got {got!r}"
    for k, v in want.items():
        assert k in got, f"{where}: missing {k!r} in {got}"
        if isinstance(v, dict) and v:
            subset(got[k], v, f"{where}.{k}")
        else:
            assert got[k] == v, f"{where}.{k}: {got[k]!r} != {v!r} (in {got})"


def expect_416(r):
    """A 416 with the TailResponse body {"tail": {"seq_num", "timestamp"}}; returns the tail."""
    body = json_of(r, 416)
    assert set(body) == {"tail"}, describe(r)
    assert set(body["tail"]) == {"seq_num", "timestamp"}, describe(r)
    return body["tail"]


def position(p):
    assert isinstance(p, dict) and set(p) == {"seq_num", "timestamp"}, p
    assert isinstance(p["seq_num"], int) and p["seq_num"] >= 0, p
    assert isinstance(p["timestamp"], int) and p["timestamp"] >= 0, p
    return p


# --- the S2 face, bound to one basin -----------------------------------------

class Basin:
    """Requests on one basin of the S2 face; the basin goes in the `s2-basin` header."""

    def __init__(self, c, name):
        self.c, self.name = c, name

    @classmethod
    def create(cls, c, name=None, config=None):
        name = name or unique_basin()
        body = {"basin": name}
        if config is not None:
            body["config"] = config
        json_of(c.post("/v1/basins", json=body), 201)
        return cls(c, name)

    def headers(self, extra=None, fmt=None):
        h = {"s2-basin": self.name}
        if fmt is not None:
            h["s2-format"] = fmt
        h.update(extra or {})
        return h

    # streams
    def create_stream(self, name=None, config=None):
        name = name or unique_stream()
        body = {"stream": name}
        if config is not None:
            body["config"] = config
        json_of(self.c.post("/v1/streams", json=body, headers=self.headers()), 201)
        return name

    def stream_config(self, stream):
        return json_of(self.c.get(stream_path(stream), headers=self.headers()))

    # records
    def post(self, stream, body, fmt=None, headers=None):
        """POST .../records with `body` (a dict/list sent as JSON, or raw str/bytes)."""
        h = self.headers(headers, fmt)
        if isinstance(body, (dict, list)):
            return self.c.post(records_path(stream), json=body, headers=h)
        h.setdefault("content-type", JSON_CT)
        return self.c.post(records_path(stream), content=body, headers=h)

    def append(self, stream, records, status=200, fmt=None, headers=None, **fields):
        """Appends `records` (str bodies or AppendRecord dicts); asserts `status`."""
        body = {"records": [{"body": r} if isinstance(r, str) else r for r in records]}
        body.update(fields)
        return check(self.post(stream, body, fmt, headers), status)

    def ack(self, stream, records, fmt=None, headers=None, **fields):
        """Appends and returns the checked AppendAck."""
        ack = json_of(self.append(stream, records, 200, fmt, headers, **fields))
        assert set(ack) == {"start", "end", "tail"}, ack
        for k in ack:
            position(ack[k])
        return ack

    def read(self, stream, status=200, fmt=None, headers=None, **params):
        return check(self.c.get(records_path(stream), params=params,
                                headers=self.headers(headers, fmt)), status)

    def batch(self, stream, fmt=None, headers=None, **params):
        """A unary read's ReadBatch (200, JSON)."""
        body = json_of(self.read(stream, 200, fmt, headers, **params))
        assert isinstance(body.get("records"), list), body
        return body

    def records(self, stream, fmt=None, **params):
        return self.batch(stream, fmt, **params)["records"]

    def all_records(self, stream, fmt=None):
        """Every record from seq_num 0 (or the first retained) to the tail."""
        out = []
        tail = self.tail(stream)["seq_num"]
        nxt = 0
        while nxt < tail:
            got = self.records(stream, fmt, seq_num=nxt)
            assert got, f"no records from {nxt} below the tail {tail}"
            out += got
            nxt = got[-1]["seq_num"] + 1
        return out

    def tail(self, stream):
        body = json_of(self.c.get(tail_path(stream), headers=self.headers()))
        assert set(body) == {"tail"}, body
        return position(body["tail"])

    def sse(self, stream, fmt=None, headers=None, **params):
        h = self.headers(headers, fmt)
        h["accept"] = SSE_CT
        return SSE(self.c, records_path(stream), params, h)


# --- SSE ----------------------------------------------------------------------

class Event(harness.Event):
    """An S2 SSE event: type "batch", "ping", "error", or "message" (no event: line)."""

    @property
    def done(self):
        return self.type == "message" and self.data == "[DONE]"


class SSE(harness.SSE):
    """Reads an S2 SSE read session event by event, with bounded waits.

        with basin.sse(stream, seq_num=0) as s:
            s.until(lambda e: e.type == "ping")
    """

    event_class = Event

    def until_ping(self, timeout=WAIT_S):
        return self.until(lambda e: e.type == "ping", timeout)


def batches(events):
    return [e for e in events if e.type == "batch"]


def batch_records(events):
    out = []
    for e in batches(events):
        out += e.json()["records"]
    return out


def event_id(ev):
    """(seq_num, count, bytes) of a batch event's id."""
    assert ev.id is not None, f"batch event without id: {ev}"
    parts = ev.id.split(",")
    assert len(parts) == 3 and all(p.isdigit() for p in parts), f"bad id {ev.id!r}"
    return tuple(int(p) for p in parts)


# --- concurrency ----------------------------------------------------------------

class Background:
    """Runs fn() in a thread; result() re-raises its exception."""

    def __init__(self, fn):
        self._result, self._error = None, None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn):
        try:
            self._result = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            self._error = e

    def done(self):
        return not self._thread.is_alive()

    def result(self, timeout=WAIT_S + 5):
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"background call still running after {timeout} s"
        if self._error is not None:
            raise self._error
        return self._result


# --- the Durable Streams face ---------------------------------------------------

def ds_create(c, basin, stream, content_type=OCTET, body=None, status=201):
    h = {"Content-Type": content_type} if content_type else {}
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    return check(c.put(ds_path(basin, stream), content=body, headers=h), status)


def ds_append(c, basin, stream, body, content_type=OCTET, status=204):
    if not isinstance(body, (str, bytes)):
        body = json.dumps(body)
    return check(c.post(ds_path(basin, stream), content=body,
                        headers={"Content-Type": content_type}), status)


def ds_read(c, basin, stream, status=200, **params):
    params.setdefault("offset", "-1")
    return check(c.get(ds_path(basin, stream), params=params), status)


def ds_head(c, basin, stream, status=200):
    return check(c.head(ds_path(basin, stream)), status)
