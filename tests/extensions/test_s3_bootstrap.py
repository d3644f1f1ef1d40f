"""Seed 000 §3: bootstrap. One multipart/mixed response: the snapshot (or an
empty application/octet-stream part), then one part per retained message
after the snapshot point. Parsed with Python's email package."""

import json
import random

import pytest

from helpers import (ALL_BYTES, JSON_CT, OCTET, SEED, START, TEXT, append, append_all, check,
                     create_stream, describe, frames, head, multipart, next_offset, read_bytes,
                     retain, snapshot, spath, unique)

SNAP_CT = "application/x-test-snapshot"


def bootstrap(c, path):
    r = check(c.get(f"{path}/bootstrap"), 200)
    assert r.headers.get("cache-control") == "no-store", describe(r)
    assert r.headers.get("stream-up-to-date") == "true", describe(r)
    return r, multipart(r)


def tricky_messages():
    """Binary messages that a careless multipart writer or reader would mangle."""
    rng = random.Random(SEED)
    return [
        ALL_BYTES,
        ALL_BYTES[::-1] * 2,
        b"\r\n--\r\n\r\n",
        b"--rr-bootstrap\r\nContent-Type: text/plain\r\n\r\nnot a part\r\n",
        b"\n",
        b"\r",
        b"ends with CRLF\r\n",
        b"\x00",
        bytes(rng.randrange(256) for _ in range(4096)),
    ]


# --- §3.2 response --------------------------------------------------------------

def test_s3_2_bootstrap_without_snapshot_has_an_empty_first_part(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, OCTET)
    msgs = [b"one", b"two", b"three"]
    offsets = append_all(c, path, msgs)
    r, parts = bootstrap(c, path)
    assert r.headers["stream-snapshot-offset"] == "-1"
    assert r.headers["stream-next-offset"] == offsets[-1]
    assert parts[0].content_type == OCTET and parts[0].body == b""
    assert [p.body for p in parts[1:]] == msgs
    assert all(p.content_type == OCTET for p in parts[1:])


def test_s3_2_bootstrap_of_an_empty_stream_is_one_empty_part(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, TEXT)
    r, parts = bootstrap(c, path)
    assert r.headers["stream-snapshot-offset"] == "-1"
    assert r.headers["stream-next-offset"] == START
    assert len(parts) == 1
    assert parts[0].content_type == OCTET and parts[0].body == b""


def test_s3_2_bootstrap_with_snapshot_sends_it_then_later_messages(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, OCTET)
    msgs = [b"m0", b"m1", b"m2", b"m3"]
    o = append_all(c, path, msgs)
    snapshot(c, path, o[2], b"STATE(m0,m1)", SNAP_CT)
    r, parts = bootstrap(c, path)
    assert r.headers["stream-snapshot-offset"] == o[2]
    assert r.headers["stream-next-offset"] == o[-1]
    assert parts[0].content_type == SNAP_CT
    assert parts[0].body == b"STATE(m0,m1)"
    assert [p.body for p in parts[1:]] == [b"m2", b"m3"]
    assert [p.content_type for p in parts[1:]] == [OCTET, OCTET]


def test_s3_2_bootstrap_snapshot_at_the_tail_is_the_only_part(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, OCTET, body=b"abc")
    tail = next_offset(c, path)
    snapshot(c, path, tail, ALL_BYTES, SNAP_CT)
    r, parts = bootstrap(c, path)
    assert r.headers["stream-snapshot-offset"] == tail
    assert r.headers["stream-next-offset"] == tail
    assert len(parts) == 1
    assert parts[0].body == ALL_BYTES


def test_s3_2_bootstrap_binary_parts_are_untouched(c, bucket):
    path = spath(bucket, "bin")
    create_stream(c, path, OCTET)
    msgs = tricky_messages()
    o = append_all(c, path, msgs)
    snap = ALL_BYTES + b"\r\n--" + ALL_BYTES
    snapshot(c, path, o[1], snap)  # default content type
    r, parts = bootstrap(c, path)
    assert parts[0].content_type == OCTET
    assert parts[0].body == snap
    assert len(parts) == len(msgs)  # snapshot + messages 1..
    for i, (part, msg) in enumerate(zip(parts[1:], msgs[1:]), start=1):
        assert part.body == msg, f"message {i} changed: {msg[:40]!r} -> {part.body[:40]!r}"


def test_s3_2_bootstrap_keeps_every_part_whole_and_in_order_across_large_messages_and_reads(c, bucket):
    """Large messages and runs of small ones, more than one internal read's worth (several MiB):
    every part comes back whole, in order, however the server frames the body."""
    path = spath(bucket, "mixed")
    create_stream(c, path, OCTET)
    rng = random.Random(SEED)
    msgs = []
    for i in range(7):
        msgs.append(bytes([i]) * (1024 * 1024))          # large: sent as stored
        msgs += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
                 for _ in range(20)]                        # small: copied together
        msgs.append(bytes([255 - i]) * (16 * 1024 + i))   # just above the copy threshold
    append_all(c, path, msgs)
    r, parts = bootstrap(c, path)
    assert parts[0].body == b""
    assert len(parts) == 1 + len(msgs)
    for i, (part, msg) in enumerate(zip(parts[1:], msgs)):
        assert part.body == msg, f"message {i} ({len(msg)} bytes) came back as {len(part.body)}"


def test_s3_2_bootstrap_json_stream_has_one_value_per_part(c, bucket):
    path = spath(bucket, "j")
    create_stream(c, path, JSON_CT, body=[{"a": 1}, {"b": [1, 2]}])
    append(c, path, '[[1,2],{"x":"é\\n"}]', JSON_CT)
    append(c, path, '"just a string"', JSON_CT)
    r, parts = bootstrap(c, path)
    assert r.headers["stream-snapshot-offset"] == "-1"
    values = [json.loads(p.body) for p in parts[1:]]
    assert values == [{"a": 1}, {"b": [1, 2]}, [1, 2], {"x": "é\n"}, "just a string"]
    assert all(p.content_type == JSON_CT for p in parts[1:])


def test_s3_2_bootstrap_json_stream_with_snapshot_at_a_record_inside_an_append(c, bucket):
    path = spath(bucket, "j")
    create_stream(c, path, JSON_CT, body=[1, 2, 3, 4])
    check(c.put(f"{path}/snapshot", params={"record": "2"}, content=b'{"upto":2}',
                headers={"Content-Type": JSON_CT}), 204)
    r, parts = bootstrap(c, path)
    assert parts[0].content_type == JSON_CT and json.loads(parts[0].body) == {"upto": 2}
    assert [json.loads(p.body) for p in parts[1:]] == [3, 4]


def test_s3_2_bootstrap_part_type_is_the_stream_content_type(c, bucket):
    path = spath(bucket, "t")
    create_stream(c, path, "text/markdown", body=b"# one\n")
    append(c, path, b"two\n", "text/markdown")
    stream_ct = head(c, path).headers["content-type"]
    r, parts = bootstrap(c, path)
    assert [p.content_type for p in parts[1:]] == [stream_ct, stream_ct]
    assert [p.body for p in parts[1:]] == [b"# one\n", b"two\n"]


def test_s3_2_bootstrap_after_retention_starts_after_the_snapshot(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, OCTET)
    o = append_all(c, path, [b"a", b"b", b"c", b"d"])
    snapshot(c, path, o[2], b"ab", SNAP_CT)
    retain(c, path, o[1])
    r, parts = bootstrap(c, path)
    assert r.headers["stream-snapshot-offset"] == o[2]
    assert [p.body for p in parts] == [b"ab", b"c", b"d"]
    retain(c, path, o[2])
    assert [p.body for p in bootstrap(c, path)[1]] == [b"ab", b"c", b"d"]


def test_s3_2_bootstrap_next_offset_resumes_tailing(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, OCTET)
    o = append_all(c, path, [b"a", b"b"])
    snapshot(c, path, o[1], b"A", SNAP_CT)
    r, parts = bootstrap(c, path)
    resume = r.headers["stream-next-offset"]
    append(c, path, b"c")
    assert read_bytes(c, path, resume) == b"c"
    lp = check(c.get(path, params={"offset": resume, "live": "long-poll"}), 200)
    assert lp.content == b"c"


def test_s3_2_bootstrap_sees_append_batch_frames_as_separate_parts(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, OCTET)
    check(c.post(f"{path}/append-batch", content=frames(b"f1", ALL_BYTES, b"f3"),
                 headers={"Content-Type": OCTET}), 200)
    r, parts = bootstrap(c, path)
    assert [p.body for p in parts[1:]] == [b"f1", ALL_BYTES, b"f3"]


def test_s3_2_bootstrap_of_missing_stream_is_404(c, bucket):
    check(c.get(f"{spath(bucket, 'nope')}/bootstrap"), 404)
    check(c.get(f"/{unique('b')}/nope/bootstrap"), 404)


# --- §3.1 / §3.3 request parameters -------------------------------------------------

@pytest.mark.parametrize("live", ["sse", "long-poll", "true", ""])
def test_s3_1_bootstrap_with_a_live_parameter_is_400(c, bucket, live):
    path = spath(bucket, "s")
    create_stream(c, path, OCTET, body=b"x")
    with c.stream("GET", f"{path}/bootstrap", params={"live": live}) as r:
        check(r, 400)


# --- §3.4 compatibility -------------------------------------------------------------

def test_s3_4_ordinary_reads_never_return_snapshot_bytes(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, OCTET)
    o = append_all(c, path, [b"a", b"b"])
    snapshot(c, path, o[1], b"SNAPSHOT", SNAP_CT)
    assert read_bytes(c, path) == b"ab"
    assert read_bytes(c, path, START) == b"ab"
    assert read_bytes(c, path, o[1]) == b"b"
    assert b"SNAPSHOT" not in check(c.get(path, params={"offset": o[1], "live": "long-poll"}),
                                    200).content


def test_s3_4_after_410_bootstrap_rebuilds_the_state(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, OCTET)
    msgs = [b"1", b"2", b"3", b"4"]
    o = append_all(c, path, msgs)
    snapshot(c, path, o[3], b"1+2+3", SNAP_CT)
    retain(c, path, o[3])
    check(c.get(path, params={"offset": START}), 410)
    r, parts = bootstrap(c, path)
    assert r.headers["stream-snapshot-offset"] == o[3]
    assert [p.body for p in parts] == [b"1+2+3", b"4"]
    append(c, path, b"5")
    assert read_bytes(c, path, r.headers["stream-next-offset"]) == b"5"


def test_s3_4_a_fork_of_a_trimmed_stream_bootstraps_from_the_sources_snapshot(c, bucket):
    # The fork starts where its source's retained history does: it answers 410 below that
    # offset, so its bootstrap must carry a snapshot covering it.
    path = spath(bucket, "src")
    create_stream(c, path, OCTET)
    o = append_all(c, path, [b"aaa", b"bbb", b"ccc"])
    snapshot(c, path, o[2], b"aaabbb", SNAP_CT)
    retain(c, path, o[1])
    fork = spath(bucket, "fork")
    check(c.put(fork, headers={"Content-Type": OCTET, "Stream-Forked-From": path}), 201)
    check(c.get(fork, params={"offset": START}), 410)
    r, parts = bootstrap(c, fork)
    assert r.headers["stream-snapshot-offset"] == o[2]
    assert [(p.content_type, p.body) for p in parts] == [(SNAP_CT, b"aaabbb"), (OCTET, b"ccc")]
    assert check(c.get(f"{fork}/snapshot/{o[2]}"), 200).content == b"aaabbb"

    def fork_at(name, offset):
        return c.put(spath(bucket, name), headers={
            "Content-Type": OCTET, "Stream-Forked-From": path, "Stream-Fork-Offset": offset})
    # Between the retained offset and the snapshot no snapshot covers the fork's history;
    # below the retained offset the history is gone.
    check(fork_at("early", o[1]), 409)
    check(fork_at("gone", o[0]), 410)
