"""Drives a running server with the public Python client (PyPI durable-streams):
create, append, catch-up read, SSE and long-poll tails, and close, for a text
stream and a JSON stream. Run by ../run, which sets RUNNEL_URL.

Client 0.1.0 predates stream closure: it has no close call and its HeadResult
has no closed flag. We close through the client's own append with a
`Stream-Closed: true` header (append-and-close), and read the closed state from
the reader's response headers and from a plain HEAD.
"""

import os
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field

import httpx
import pytest
from durable_streams import DurableStream, DurableStreamError, stream

BASE = os.environ.get("RUNNEL_URL")
if not BASE:
    raise RuntimeError("RUNNEL_URL is not set (use tests/clients/run)")

# How long to wait for something the server should do promptly.
WAIT_S = 10.0


@dataclass
class Kind:
    name: str
    content_type: str
    initial: list
    live_msgs: dict
    final: object

    @property
    def is_json(self):
        return self.content_type == "application/json"

    def join(self, msgs):
        return list(msgs) if self.is_json else "".join(msgs)

    def read(self, res):
        return res.read_json() if self.is_json else res.read_text()


KINDS = [
    Kind("text", "text/plain", ["hello ", "world"],
         {"sse": "via-sse|", "long-poll": "via-long-poll|"}, "bye"),
    Kind("json", "application/json", [{"n": 1, "s": "one"}, {"n": 2, "nested": {"ok": True}}],
         {"sse": {"via": "sse"}, "long-poll": {"via": "long-poll"}}, {"final": True}),
]


@dataclass
class Ctx:
    kind: Kind
    url: str
    handle: DurableStream
    written: list = field(default_factory=list)


@pytest.fixture(scope="module", params=KINDS, ids=lambda k: k.name)
def ctx(request):
    kind = request.param
    url = f"{BASE}/v1/stream/py-{kind.name}-{uuid.uuid4().hex[:12]}"
    handle = DurableStream(url, content_type=kind.content_type)
    yield Ctx(kind, url, handle)
    handle.close()


class LiveTail:
    """A live reader on a background thread; the test waits on what it saw."""

    def __init__(self, ctx, live):
        self.kind = ctx.kind
        # The first request is sent here, so "now" is fixed before we return.
        self.res = ctx.handle.stream(offset="now", live=live)
        self.got = queue.Queue()
        self.seen = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        it = self.res.iter_json() if self.kind.is_json else self.res.iter_text()
        try:
            for item in it:
                if item != "":
                    self.got.put(item)
        except Exception as e:  # reported to the waiting test unless we stopped it
            if not self.res.closed:
                self.got.put(e)

    def wait_for(self, n):
        """Waits until the reader has produced n items (or text of length n)."""
        deadline = time.monotonic() + WAIT_S
        while len(self.kind.join(self.seen)) < n:
            left = deadline - time.monotonic()
            try:
                item = self.got.get(timeout=max(left, 0))
            except queue.Empty:
                pytest.fail(f"timed out after {WAIT_S}s; reader saw {self.seen!r}")
            if isinstance(item, Exception):
                raise item
            self.seen.append(item)
        return self.kind.join(self.seen)

    def stop(self):
        self.res.close()


def test_create(ctx):
    ctx.handle.create_stream()
    head = ctx.handle.head()
    assert head.exists
    assert head.content_type.startswith(ctx.kind.content_type)


def test_append(ctx):
    before = ctx.handle.head().offset
    last = None
    for m in ctx.kind.initial:
        last = ctx.handle.append(m).next_offset
        ctx.written.append(m)
    assert last > before
    assert ctx.handle.head().offset == last


def test_catch_up_read(ctx):
    with stream(ctx.url, live=False) as res:
        assert ctx.kind.read(res) == ctx.kind.join(ctx.written)
        assert res.up_to_date
        assert "stream-closed" not in res.headers


@pytest.mark.parametrize("live", ["sse", "long-poll"])
def test_live_tail_from_now_sees_new_append(ctx, live):
    tail = LiveTail(ctx, live)
    try:
        msg = ctx.kind.live_msgs[live]
        ctx.handle.append(msg)
        ctx.written.append(msg)
        expected = ctx.kind.join([msg])
        assert tail.wait_for(len(expected)) == expected
    finally:
        tail.stop()


def test_close_is_seen_by_readers_and_head(ctx):
    closer = DurableStream(ctx.url, content_type=ctx.kind.content_type,
                           headers={"Stream-Closed": "true"}, batching=False)
    with closer:
        final_offset = closer.append(ctx.kind.final).next_offset
    ctx.written.append(ctx.kind.final)

    # HEAD reports the closed state at the final offset.
    head = httpx.head(ctx.url, timeout=WAIT_S)
    assert head.status_code == 200
    assert head.headers.get("stream-closed") == "true"
    assert head.headers.get("stream-next-offset") == final_offset
    assert ctx.handle.head().offset == final_offset

    # A reader gets everything, including the final message, and the
    # closed state.
    with stream(ctx.url, live=False) as res:
        assert ctx.kind.read(res) == ctx.kind.join(ctx.written)
        assert res.headers.get("stream-closed") == "true"
        assert res.offset == final_offset

    # A closed stream rejects appends (409).
    with DurableStream(ctx.url, content_type=ctx.kind.content_type, batching=False) as h:
        with pytest.raises(DurableStreamError):
            h.append(ctx.kind.initial[0])
