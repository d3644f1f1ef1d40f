"""Small helpers shared by the extension tests: request shortcuts, response
checks, a multipart/mixed parser (Python's email package), an SSE reader,
Append Batch framing and a raw HTTP/1.1 sender for oversized bodies. The
response checks and the SSE reader are tests/pylib/runnel_harness.py's (shared
with tests/s2; conftest.py puts it on sys.path)."""

import json
import os
import random
import select
import socket
import struct
import threading
import uuid
from dataclasses import dataclass
from email import policy
from email.parser import BytesParser
from urllib.parse import quote, unquote, urlsplit

import runnel_harness as harness
from runnel_harness import JSON_CT, OCTET, TEXT, WAIT_S, check, describe, media_type  # noqa: F401

# Seed of every randomised test in this run (printed in the pytest header).
SEED = int(os.environ.get("EXTENSIONS_SEED") or random.SystemRandom().randrange(2**32))

START = "0000000000000000_0000000000000000"
NDJSON = "application/x-ndjson"
ENVELOPE_NDJSON = "application/vnd.durable-stream-records+ndjson"
ENVELOPE_SSE = "application/vnd.durable-stream-record+json"
RECORDS_TOKEN = "json-record-coordinates-v1"
ALL_BYTES = bytes(range(256))


# --- names and URLs ---------------------------------------------------------

def unique(prefix="t"):
    """A fresh name that is a valid bucket id and a valid stream id."""
    return f"{prefix}{uuid.uuid4().hex[:16]}"


def seg(text):
    """Percent-encodes one path segment (every reserved character, '/' too)."""
    return quote(text, safe="")


def spath(bucket, stream):
    """The path of a stream on the bucketed surface."""
    return f"/{bucket}/{seg(stream)}"


def forge_offset(seq, pos):
    """An offset token in Runnel's documented shape. Only for tests that need a
    token the server never returned (misaligned, beyond the tail)."""
    return f"{seq:016d}_{pos:016d}"


# --- checks (describe, check, media_type: runnel_harness) ---------------------

def extension_tokens(r):
    value = r.headers.get("stream-extensions")
    if value is None:
        return set()
    return {t.strip() for t in value.split(",") if t.strip()}


def int_header(r, name):
    value = r.headers.get(name)
    assert value is not None, f"missing {name}\n{describe(r)}"
    assert value.isdigit(), f"{name} is not an unsigned integer: {value!r}"
    return int(value)


def record_headers(r):
    """(First, Start, Next) from a record-aware read; First may be None."""
    first = r.headers.get("stream-record-first")
    return (int(first) if first is not None else None,
            int_header(r, "stream-record-start"), int_header(r, "stream-record-next"))


# --- requests ---------------------------------------------------------------

def create_bucket(c, bucket=None):
    bucket = bucket or unique("b")
    check(c.put(f"/{bucket}"), 201)
    return bucket


def create_stream(c, path, content_type=OCTET, body=None, headers=None, status=201):
    h = {"Content-Type": content_type} if content_type else {}
    h.update(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    return check(c.put(path, content=body, headers=h), status)


def append(c, path, body, content_type=OCTET, headers=None, status=204):
    h = {"Content-Type": content_type} if content_type else {}
    h.update(headers or {})
    if not isinstance(body, (str, bytes)):
        body = json.dumps(body)
    return check(c.post(path, content=body, headers=h), status)


def append_all(c, path, bodies, content_type=OCTET):
    """Appends each body as its own POST; returns [start, after 1st, after 2nd, ...]."""
    offsets = [next_offset(c, path)]
    for body in bodies:
        offsets.append(append(c, path, body, content_type).headers["stream-next-offset"])
    return offsets


def head(c, path, status=200):
    return check(c.head(path), status)


def next_offset(c, path):
    return head(c, path).headers["stream-next-offset"]


def read(c, path, status=200, **params):
    return check(c.get(path, params=params), status)


def peek(c, path, **params):
    """A GET whose body is never read (for SSE URLs): status and headers only."""
    with c.stream("GET", path, params=params) as r:
        return r


def read_bytes(c, path, offset="-1"):
    return read(c, path, offset=offset).content


def read_json(c, path, offset="-1"):
    r = read(c, path, offset=offset)
    assert media_type(r.headers.get("content-type")) == JSON_CT, describe(r)
    return r.json()


def ndjson(r):
    """The values of an NDJSON body: one JSON value per line, every line ending in \\n."""
    body = r.content
    if body == b"":
        return []
    assert body.endswith(b"\n"), f"NDJSON body does not end in a newline: {body[-50:]!r}"
    lines = body[:-1].split(b"\n")
    values = []
    for line in lines:
        assert line.strip(), f"blank line in NDJSON body: {body[:300]!r}"
        values.append(json.loads(line))
    return values


def frames(*payloads):
    """An Append Batch body: uint32_be length, payload, ..."""
    out = bytearray()
    for p in payloads:
        p = p.encode() if isinstance(p, str) else p
        out += struct.pack(">I", len(p)) + p
    return bytes(out)


def snapshot(c, path, offset, body, content_type=None, headers=None, status=204):
    h = {"Content-Type": content_type} if content_type else {}
    h.update(headers or {})
    return check(c.put(f"{path}/snapshot/{seg(offset)}", content=body, headers=h), status)


def retain(c, path, offset, status=204):
    return check(c.put(f"{path}/retention/{seg(offset)}"), status)


# --- multipart/mixed (bootstrap) -------------------------------------------

@dataclass
class Part:
    content_type: str
    body: bytes


def multipart(r):
    """Parses a multipart/mixed response with Python's email package; returns
    its parts. Fails on any parser defect or part without Content-Type."""
    ctype = r.headers.get("content-type", "")
    assert media_type(ctype) == "multipart/mixed", describe(r)
    raw = b"Content-Type: " + ctype.encode("latin-1") + b"\r\n\r\n" + r.content
    msg = BytesParser(policy=policy.HTTP).parsebytes(raw)
    assert msg.get_param("boundary"), f"no boundary parameter: {ctype!r}"
    assert msg.is_multipart(), f"not a multipart body:\n{describe(r)}"
    assert not msg.defects, f"multipart defects {msg.defects}:\n{describe(r)}"
    parts = []
    for part in msg.iter_parts():
        assert not part.defects, f"part defects {part.defects}:\n{describe(r)}"
        assert part["Content-Type"] is not None, f"part without Content-Type:\n{describe(r)}"
        parts.append(Part(str(part["Content-Type"]).strip(), part.get_payload(decode=True)))
    return parts


# --- SSE --------------------------------------------------------------------

class SSE(harness.SSE):
    """Reads an SSE response event by event, with bounded waits.

        with SSE(c, path, offset="-1", live="sse") as s:
            events = s.until(lambda e: e.type == "control" and e.json().get("upToDate"))
    """
    def __init__(self, client, path, **params):
        super().__init__(client, path, params)

    def until_up_to_date(self, timeout=WAIT_S):
        return self.until(lambda e: e.type == "control" and e.json().get("upToDate") is True,
                          timeout)


def data_events(events):
    return [e for e in events if e.type == "data"]


def controls(events):
    return [e.json() for e in events if e.type == "control"]


# --- raw HTTP/1.1 for oversized bodies -------------------------------------

def raw_request(base_url, method, path, headers, body, timeout=60.0):
    """Sends one request over a plain socket with `Expect: 100-continue`, so a
    server that rejects on the headers never has to take (or reset on) a huge
    body; if it asks for the body (or says nothing within 1 s) the body is sent
    while the answer is read. Returns (status, lower-cased headers)."""
    u = urlsplit(base_url)
    sock = socket.create_connection((u.hostname, u.port), timeout=timeout)
    try:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {u.hostname}:{u.port}",
                 f"Content-Length: {len(body)}", "Expect: 100-continue", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        reader = sock.makefile("rb")
        sender = None
        readable, _, _ = select.select([sock], [], [], 1.0)
        status, hdrs = (None, None)
        if readable:
            status, hdrs = _read_head(reader)
        if status is None or status == 100:
            def send():
                try:
                    sock.sendall(body)
                except OSError:
                    pass  # the server answered early and stopped reading
            sender = threading.Thread(target=send, daemon=True)
            sender.start()
            status, hdrs = _read_head(reader)
            while status is not None and 100 <= status < 200:
                status, hdrs = _read_head(reader)
        assert status is not None, "the server closed the connection without an answer"
        if sender is not None:
            sender.join(timeout=1)
        return status, hdrs
    finally:
        sock.close()


def _read_head(reader):
    line = reader.readline()
    if not line:
        return None, None
    status = int(line.split()[1])
    hdrs = {}
    while True:
        line = reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        k, _, v = line.decode("latin-1").partition(":")
        hdrs[k.strip().lower()] = v.strip()
    return status, hdrs


def location_path(r):
    """The percent-decoded path segments of a Location header."""
    loc = r.headers.get("location")
    assert loc, f"no Location header\n{describe(r)}"
    return [unquote(s) for s in urlsplit(loc).path.split("/")]
