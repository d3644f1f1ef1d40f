"""Durability of every seed 000 extension across a SIGKILL. One module-wide
world is built (buckets, streams with attributes, snapshots, retention, JSON
records from PUT / POST / append-batch / an idempotent producer, a closed
stream, deletions), observed, the server is killed with SIGKILL and started
again on the same data dir, and observed again. Each test compares one aspect
and then checks that the restarted server keeps behaving (rules still
enforced, new writes continue the same offsets and ordinals).

Needs a server this suite starts: skipped with EXTENSIONS_URL."""

import json
import threading
from types import SimpleNamespace

import pytest

from helpers import (ALL_BYTES, JSON_CT, OCTET, START, TEXT, append, append_all, check,
                     create_bucket, create_stream, frames, int_header, multipart, ndjson,
                     next_offset, read, read_bytes, retain, seg, snapshot, spath)

SNAP_CT = "application/x-test-snapshot"
BIN_ATTRS = {"title": "binary", "metadata": {"k": [1, 2, {"deep": True}]}}
JSON_ATTRS = {"title": "events v2", "metadata": {"purpose": "durability"}}


def build(c):
    w = SimpleNamespace()
    w.b1, w.b2, w.b3 = create_bucket(c), create_bucket(c), create_bucket(c)
    check(c.delete(f"/{w.b3}"), 204)

    # A byte stream with a unicode id, attributes, a superseded snapshot, the
    # visible one, and retention.
    w.bin = spath(w.b1, "binary ü")
    create_stream(c, w.bin, OCTET, headers={"Stream-Attrs": json.dumps(BIN_ATTRS)})
    w.bin_msgs = [ALL_BYTES, b"two", b"\r\n--three", b"four"]
    w.o = append_all(c, w.bin, w.bin_msgs)
    snapshot(c, w.bin, w.o[1], b"superseded", SNAP_CT)
    w.bin_digest = snapshot(c, w.bin, w.o[3], ALL_BYTES * 2,
                            SNAP_CT).headers["stream-snapshot-digest"]
    retain(c, w.bin, w.o[2])

    # A JSON stream: PUT, POST arrays, append-batch, an idempotent producer,
    # record-addressed snapshot and retention, replaced attributes.
    w.js = spath(w.b1, "events")
    create_stream(c, w.js, JSON_CT, body=[{"n": 0}, {"n": 1}],
                  headers={"Stream-Attrs": json.dumps({"title": "events v1"})})
    append(c, w.js, '[{"n":2},[3,3],{"n":4}]', JSON_CT)
    acks = check(c.post(f"{w.js}/append-batch", content=frames('{"n":5}', '[{"n":6},"seven"]'),
                        headers={"Content-Type": JSON_CT}), 200).json()
    assert [a["status"] for a in acks] == [204, 204]
    w.producer_body = '[{"p":8},{"p":9}]'
    r = check(c.post(w.js, content=w.producer_body,
                     headers={"Content-Type": JSON_CT, "Producer-Id": "dur", "Producer-Epoch": "0",
                              "Producer-Seq": "0"}), (200, 204))
    w.producer_range = (int_header(r, "stream-record-start"), int_header(r, "stream-record-next"))
    assert w.producer_range == (8, 10)
    w.js_values = [{"n": 0}, {"n": 1}, {"n": 2}, [3, 3], {"n": 4}, {"n": 5}, {"n": 6}, "seven",
                   {"p": 8}, {"p": 9}]
    check(c.put(f"{w.js}/snapshot", params={"record": "6"}, content=b'{"upto":6}',
                headers={"Content-Type": JSON_CT}), 204)
    check(c.put(f"{w.js}/retention", params={"record": "4"}), 204)
    check(c.put(f"{w.js}/attrs", content=json.dumps({**JSON_ATTRS, "dropped": 1}),
                headers={"Content-Type": JSON_CT}), 204)

    # A closed text stream, a stream whose snapshot was deleted, a deleted stream.
    w.closed = spath(w.b1, "closed")
    create_stream(c, w.closed, TEXT, body=b"the end", headers={"Stream-Closed": "true"})
    w.nosnap = spath(w.b1, "nosnap")
    create_stream(c, w.nosnap, OCTET, body=b"x")
    snapshot(c, w.nosnap, next_offset(c, w.nosnap), b"deleted")
    w.nosnap_tail = next_offset(c, w.nosnap)
    check(c.delete(f"{w.nosnap}/snapshot/{seg(w.nosnap_tail)}"), 204)
    w.gone = spath(w.b1, "gone")
    create_stream(c, w.gone, TEXT, body=b"bye")
    check(c.delete(w.gone), 204)
    w.streams = [w.bin, w.js, w.closed, w.nosnap]
    return w


HEAD_KEYS = ["content-type", "stream-next-offset", "stream-closed", "stream-snapshot-offset",
             "stream-snapshot-digest", "stream-record-first", "stream-record-next",
             "stream-extensions"]


def observe(c, w):
    o = {"b1": c.get(f"/{w.b1}").json(), "b2": c.get(f"/{w.b2}").json(),
         "b3": c.get(f"/{w.b3}").status_code,
         "listing": check(c.get(f"/{w.b1}/streams"), 200).json(),
         "gone": c.head(w.gone).status_code}
    for path in w.streams:
        h = check(c.head(path), 200)
        boot = check(c.get(f"{path}/bootstrap"), 200)
        latest = c.get(f"{path}/snapshot")
        snap = None
        if latest.status_code == 307:
            s = check(c.get(latest.headers["location"]), 200)
            snap = (s.content, s.headers["content-type"], s.headers["stream-snapshot-offset"],
                    s.headers["stream-snapshot-digest"], s.headers["stream-next-offset"])
        r = read(c, path, offset="-1")
        o[path] = {
            "head": {k: h.headers.get(k) for k in HEAD_KEYS},
            "attrs": check(c.get(f"{path}/attrs"), 200).json(),
            "read": (r.content, r.headers["stream-next-offset"], r.headers.get("etag")),
            "bootstrap": ({k: boot.headers.get(k) for k in ("stream-snapshot-offset",
                                                           "stream-next-offset")},
                          [(p.content_type, p.body) for p in multipart(boot)]),
            "latest": (latest.status_code, latest.headers.get("location")),
            "snapshot": snap,
        }
    env = check(c.get(w.js, params={"record": "4", "record_view": "envelope"}), 200)
    o["envelopes"] = ndjson(env)
    return o


@pytest.fixture(scope="module")
def world(server):
    if not server.restartable:
        pytest.skip("needs a server this suite starts (EXTENSIONS_URL is set)")
    c = server.client()
    w = build(c)
    w.before = observe(c, w)
    server.restart(kill=True)
    w.after = observe(c, w)
    w.c = c
    w.server = server
    return w


def test_s9_world_was_built_as_intended(world):
    b = world.before
    assert b["b1"]["streams"] == 4
    assert b["b2"]["streams"] == 0
    assert b["b3"] == 404 and b["gone"] == 404
    assert [s["stream_id"] for s in b["listing"]["streams"]] == \
        ["binary ü", "closed", "events", "nosnap"]
    assert b["envelopes"] == [{"record": 4 + i, "value": v}
                              for i, v in enumerate(world.js_values[4:])]


def test_s9_buckets_survive_sigkill(world):
    c, b, a = world.c, world.before, world.after
    assert a["b1"] == b["b1"]
    assert a["b2"] == b["b2"]
    assert a["b3"] == 404
    check(c.put(f"/{world.b1}"), 409)
    check(c.put(f"/{world.b2}"), 409)
    check(c.delete(f"/{world.b1}"), 409)


def test_s9_listing_survives_sigkill(world):
    assert world.after["listing"] == world.before["listing"]
    entries = {s["stream_id"]: s for s in world.after["listing"]["streams"]}
    assert entries["closed"]["status"] == "Closed"
    assert entries["binary ü"]["tail_offset"] == sum(len(m) for m in world.bin_msgs)


def test_s9_deleted_stream_and_bucket_stay_deleted(world):
    c = world.c
    assert world.after["gone"] == 404
    check(c.get(f"/{world.b3}/streams"), 404)
    check(c.put(spath(world.b3, "s"), headers={"Content-Type": OCTET}), 404)


def test_s9_stream_metadata_survives_sigkill(world):
    for path in world.streams:
        assert world.after[path]["head"] == world.before[path]["head"], path


def test_s9_attrs_survive_sigkill(world):
    c, a = world.c, world.after
    assert a[world.bin]["attrs"] == BIN_ATTRS
    assert a[world.js]["attrs"] == JSON_ATTRS
    assert a[world.closed]["attrs"] == {}
    for path in world.streams:
        assert a[path]["attrs"] == world.before[path]["attrs"]
    check(c.put(world.bin, headers={"Content-Type": OCTET,
                                    "Stream-Attrs": json.dumps(BIN_ATTRS)}), 200)
    check(c.put(world.bin, headers={"Content-Type": OCTET,
                                    "Stream-Attrs": json.dumps({"title": "other"})}), 409)


def test_s9_snapshot_and_digest_survive_sigkill(world):
    c, w = world.c, world
    for path in w.streams:
        assert w.after[path]["snapshot"] == w.before[path]["snapshot"], path
        assert w.after[path]["latest"] == w.before[path]["latest"], path
    content, ctype, offset, digest, nxt = w.after[w.bin]["snapshot"]
    assert (content, ctype, offset, digest, nxt) == (ALL_BYTES * 2, SNAP_CT, w.o[3],
                                                     w.bin_digest, w.o[3])
    check(c.get(f"{w.bin}/snapshot/{seg(w.o[1])}"), 404)       # superseded
    check(c.get(f"{w.nosnap}/snapshot"), 404)                   # deleted
    check(c.get(f"{w.nosnap}/snapshot/{seg(w.nosnap_tail)}"), 404)
    again = snapshot(c, w.bin, w.o[3], ALL_BYTES * 2, SNAP_CT)
    assert again.headers["stream-snapshot-digest"] == w.bin_digest
    snapshot(c, w.bin, w.o[3], b"different", SNAP_CT, status=409)


def test_s9_retention_survives_sigkill(world):
    c, w = world.c, world
    for gone in (START, w.o[1]):
        check(c.get(w.bin, params={"offset": gone}), 410)
    assert read_bytes(c, w.bin, w.o[2]).startswith(b"\r\n--three")
    assert read_bytes(c, w.bin).startswith(b"\r\n--three")
    retain(c, w.bin, w.o[1], status=409)                         # backward
    check(c.delete(f"{w.bin}/snapshot/{seg(w.o[3])}"), 409)      # bootstrap needs it
    check(c.put(f"{w.bin}/snapshot/{seg(w.o[1])}", content=b"old"), 410)
    h = check(c.head(w.js), 200)
    assert int_header(h, "stream-record-first") == 4
    check(c.get(w.js, params={"record": "3"}), 410)


def test_s9_bootstrap_survives_sigkill(world):
    w = world
    for path in w.streams:
        assert w.after[path]["bootstrap"] == w.before[path]["bootstrap"], path
    headers, parts = w.after[w.bin]["bootstrap"]
    assert headers["stream-snapshot-offset"] == w.o[3]
    assert [p[1] for p in parts] == [ALL_BYTES * 2, b"four"]
    headers, parts = w.after[w.js]["bootstrap"]
    assert [json.loads(p[1]) for p in parts] == [{"upto": 6}] + w.js_values[6:]
    headers, parts = w.after[w.nosnap]["bootstrap"]
    assert headers["stream-snapshot-offset"] == "-1"
    assert [p[1] for p in parts] == [b"", b"x"]


def test_s9_record_ordinals_survive_sigkill(world):
    c, w = world.c, world
    assert w.after["envelopes"] == w.before["envelopes"]
    assert w.after[w.js]["read"] == w.before[w.js]["read"]
    # The idempotent producer's retry is still deduplicated, with its range.
    r = check(c.post(w.js, content=w.producer_body,
                     headers={"Content-Type": JSON_CT, "Producer-Id": "dur",
                              "Producer-Epoch": "0", "Producer-Seq": "0"}), 204)
    assert (int_header(r, "stream-record-start"), int_header(r, "stream-record-next")) == \
        w.producer_range


def test_s9_writes_continue_after_sigkill(world):
    c, w = world.c, world
    for path in w.streams:
        assert w.after[path]["read"] == w.before[path]["read"], path
    tail = w.after[w.bin]["head"]["stream-next-offset"]
    new_tail = append(c, w.bin, b"five").headers["stream-next-offset"]
    assert new_tail > tail
    assert read_bytes(c, w.bin, tail) == b"five"
    n = int(w.after[w.js]["head"]["stream-record-next"])
    r = append(c, w.js, '["after","restart"]', JSON_CT)
    assert (int_header(r, "stream-record-start"), int_header(r, "stream-record-next")) == \
        (n, n + 2)
    check(c.post(w.closed, content=b"more", headers={"Content-Type": TEXT}), 409)
    # And those writes survive a second SIGKILL.
    w.server.restart(kill=True)
    assert read_bytes(c, w.bin, tail) == b"five"
    env = ndjson(check(c.get(w.js, params={"record": str(n), "record_view": "envelope"}), 200))
    assert env == [{"record": n, "value": "after"}, {"record": n + 1, "value": "restart"}]
    assert check(c.get(f"/{w.b1}"), 200).json()["streams"] == 4


def test_s9_acknowledged_appends_survive_sigkill_under_load(fresh_server):
    """Writers append JSON records as fast as they can; the server is killed
    mid-flight. Every acknowledged append is there after the restart, at the
    ordinals it was acknowledged with, and the records form one gap-free
    sequence."""
    srv = fresh_server
    c = srv.client()
    path = spath(create_bucket(c), "load")
    create_stream(c, path, JSON_CT)
    acked = []
    lock = threading.Lock()
    enough = threading.Event()
    stop = threading.Event()

    def writer(wid):
        client = srv.client(timeout=5)
        for i in range(2000):
            if stop.is_set():
                return
            body = json.dumps([{"w": wid, "i": i}, {"w": wid, "i": i, "second": True}])
            try:
                r = client.post(path, content=body, headers={"Content-Type": JSON_CT})
            except Exception:
                return  # the server died under us
            if r.status_code != 204:
                return
            with lock:
                acked.append((int(r.headers["stream-record-start"]), json.loads(body)))
                if len(acked) >= 200:
                    enough.set()

    threads = [threading.Thread(target=writer, args=(wid,), daemon=True) for wid in range(4)]
    for t in threads:
        t.start()
    enough.wait(timeout=10)
    srv.kill()
    stop.set()
    for t in threads:
        t.join(timeout=10)
    assert len(acked) >= 200, f"only {len(acked)} appends acknowledged in 10 s"
    srv.start()
    records = ndjson(check(c.get(path, params={"record": "0"}), 200))
    for start, values in acked:
        assert records[start:start + len(values)] == values, f"lost append at {start}"
    assert len(records) >= max(start + 2 for start, _ in acked)
    assert len(records) % 2 == 0  # appends are atomic: both records or neither
    h = check(c.head(path), 200)
    assert int_header(h, "stream-record-next") == len(records)
