"""Seed 000 §2: snapshots (publish, read latest, HEAD metadata, read, delete)
and retention, including the record-addressed variants on JSON streams."""

import json

import pytest

from helpers import (ALL_BYTES, JSON_CT, OCTET, START, TEXT, append, append_all, check,
                     create_stream, describe, forge_offset, head, location_path, multipart,
                     next_offset, peek, raw_request, read, read_bytes, retain, seg, snapshot,
                     spath, unique)

MSGS = [b"first-msg\x00\xff", b"second\r\n--", b"third"]
SNAP_CT = "application/x-test-snapshot"


def seeded(c, bucket, name="s", msgs=MSGS):
    """A byte stream with one message per POST; returns (path, offsets) where
    offsets[i] is the boundary before message i and offsets[-1] is the tail."""
    path = spath(bucket, name)
    create_stream(c, path, OCTET)
    return path, append_all(c, path, msgs)


def snap_url(path, offset):
    return f"{path}/snapshot/{seg(offset)}"


def latest(c, path):
    return c.get(f"{path}/snapshot")


# --- §2.2 publish -------------------------------------------------------------

def test_s2_2_publish_snapshot_is_204_with_digest(c, bucket):
    path, o = seeded(c, bucket)
    r = snapshot(c, path, o[2], b"state-after-two", SNAP_CT)
    digest = r.headers.get("stream-snapshot-digest")
    assert digest, describe(r)
    assert r.content == b""


def test_s2_2_repeat_identical_publish_returns_same_digest(c, bucket):
    path, o = seeded(c, bucket)
    d1 = snapshot(c, path, o[2], ALL_BYTES, SNAP_CT).headers["stream-snapshot-digest"]
    d2 = snapshot(c, path, o[2], ALL_BYTES, SNAP_CT).headers["stream-snapshot-digest"]
    assert d1 == d2


def test_s2_2_digest_differs_for_different_content(c, bucket):
    path_a, oa = seeded(c, bucket, "a")
    path_b, ob = seeded(c, bucket, "b")
    da = snapshot(c, path_a, oa[1], b"one", SNAP_CT).headers["stream-snapshot-digest"]
    db = snapshot(c, path_b, ob[1], b"two", SNAP_CT).headers["stream-snapshot-digest"]
    dc = snapshot(c, path_b, ob[2], b"one", TEXT).headers["stream-snapshot-digest"]
    assert len({da, db, dc}) == 3


def test_s2_2_different_body_at_same_offset_is_409(c, bucket):
    path, o = seeded(c, bucket)
    digest = snapshot(c, path, o[2], b"v1", SNAP_CT).headers["stream-snapshot-digest"]
    snapshot(c, path, o[2], b"v2", SNAP_CT, status=409)
    r = check(c.get(snap_url(path, o[2])), 200)
    assert r.content == b"v1"
    assert r.headers["stream-snapshot-digest"] == digest


def test_s2_2_different_content_type_at_same_offset_is_409(c, bucket):
    path, o = seeded(c, bucket)
    snapshot(c, path, o[2], b"same", SNAP_CT)
    snapshot(c, path, o[2], b"same", TEXT, status=409)
    assert check(c.get(snap_url(path, o[2])), 200).headers["content-type"] == SNAP_CT


def test_s2_2_content_type_defaults_to_octet_stream(c, bucket):
    path, o = seeded(c, bucket)
    r = c.put(snap_url(path, o[1]), content=b"blob")  # no Content-Type header
    check(r, 204)
    assert "content-type" not in r.request.headers
    assert check(c.get(snap_url(path, o[1])), 200).headers["content-type"] == OCTET


@pytest.mark.parametrize("given", ["", "text", "no/", "a b/c"])
def test_s2_2_a_content_type_without_type_and_subtype_falls_back_to_octet_stream(
        c, bucket, given):
    path, o = seeded(c, bucket)
    check(c.put(snap_url(path, o[1]), content=b"blob", headers={"Content-Type": given}), 204)
    assert check(c.get(snap_url(path, o[1])), 200).headers["content-type"] == OCTET
    parts = multipart(check(c.get(f"{path}/bootstrap"), 200))
    assert (parts[0].content_type, parts[0].body) == (OCTET, b"blob")


def test_s2_2_content_type_is_stored_and_returned(c, bucket):
    path, o = seeded(c, bucket)
    snapshot(c, path, o[1], b'{"k":1}', "application/vnd.example.state+json")
    r = check(c.get(snap_url(path, o[1])), 200)
    assert r.headers["content-type"] == "application/vnd.example.state+json"


def test_s2_2_snapshot_match_with_current_digest_publishes(c, bucket):
    path, o = seeded(c, bucket)
    d1 = snapshot(c, path, o[1], b"one", SNAP_CT).headers["stream-snapshot-digest"]
    d2 = snapshot(c, path, o[2], b"two", SNAP_CT,
                  headers={"Stream-Snapshot-Match": d1}).headers["stream-snapshot-digest"]
    assert head(c, path).headers["stream-snapshot-digest"] == d2
    assert head(c, path).headers["stream-snapshot-offset"] == o[2]


def test_s2_2_a_repeated_conditional_publish_succeeds_with_the_same_digest(c, bucket):
    # A client retrying after a lost response sends the same request again: its condition no
    # longer holds (the visible snapshot is now its own), yet the repeat must succeed.
    path, o = seeded(c, bucket)
    first = snapshot(c, path, o[1], b"s1", SNAP_CT).headers["stream-snapshot-digest"]
    match = {"Stream-Snapshot-Match": first}
    d1 = snapshot(c, path, o[2], b"s2", SNAP_CT, headers=match).headers["stream-snapshot-digest"]
    d2 = snapshot(c, path, o[2], b"s2", SNAP_CT, headers=match).headers["stream-snapshot-digest"]
    assert d1 == d2
    # A different snapshot at the same offset is still a conflict.
    snapshot(c, path, o[2], b"other", SNAP_CT, headers=match, status=409)


def test_s2_2_snapshot_match_mismatch_is_409(c, bucket):
    path, o = seeded(c, bucket)
    d1 = snapshot(c, path, o[1], b"one", SNAP_CT).headers["stream-snapshot-digest"]
    snapshot(c, path, o[2], b"two", SNAP_CT, headers={"Stream-Snapshot-Match": d1 + "x"},
             status=409)
    h = head(c, path)
    assert h.headers["stream-snapshot-offset"] == o[1]
    assert h.headers["stream-snapshot-digest"] == d1


def test_s2_2_snapshot_match_without_any_snapshot_is_409(c, bucket):
    path, o = seeded(c, bucket)
    snapshot(c, path, o[1], b"one", SNAP_CT, headers={"Stream-Snapshot-Match": "anything"},
             status=409)
    check(latest(c, path), 404)
    assert "stream-snapshot-offset" not in head(c, path).headers


@pytest.mark.parametrize("bad", ["abc", "12", "0000000000000001-0000000000000010",
                                 "0000000000000001_000000000000001x", "_", "1_2_3"])
def test_s2_2_malformed_snapshot_offset_is_400(c, bucket, bad):
    path, _ = seeded(c, bucket)
    check(c.put(f"{path}/snapshot/{seg(bad)}", content=b"x"), 400)
    check(latest(c, path), 404)


def test_s2_2_snapshot_offset_not_on_a_message_boundary_is_400(c, bucket):
    path, o = seeded(c, bucket)
    inside_first = forge_offset(0, 3)                  # inside message 0
    inside_second = forge_offset(1, len(MSGS[0]) + 2)  # inside message 1
    for off in (inside_first, inside_second):
        assert off not in o
        check(c.put(snap_url(path, off), content=b"x"), 400)
    check(latest(c, path), 404)


def test_s2_2_snapshot_offset_beyond_tail_is_409(c, bucket):
    path, o = seeded(c, bucket)
    total = sum(len(m) for m in MSGS)
    beyond = forge_offset(len(MSGS) + 5, total + 100)
    check(c.put(snap_url(path, beyond), content=b"x"), 409)
    check(latest(c, path), 404)


def test_s2_2_snapshot_at_the_tail_and_at_the_start_are_allowed(c, bucket):
    path, o = seeded(c, bucket)
    snapshot(c, path, o[-1], b"everything", SNAP_CT)
    assert head(c, path).headers["stream-snapshot-offset"] == o[-1]
    other, o2 = seeded(c, bucket, "other")
    snapshot(c, other, START, b"", SNAP_CT)
    assert head(c, other).headers["stream-snapshot-offset"] == START


def test_s2_2_snapshot_older_than_retained_start_is_410(c, bucket):
    path, o = seeded(c, bucket)
    snapshot(c, path, o[2], b"two", SNAP_CT)
    retain(c, path, o[2])
    check(c.put(snap_url(path, o[1]), content=b"one"), 410)
    check(c.put(snap_url(path, START), content=b"zero"), 410)
    assert head(c, path).headers["stream-snapshot-offset"] == o[2]


def test_s2_2_publish_on_missing_stream_is_404(c, bucket):
    check(c.put(snap_url(spath(bucket, "nope"), START), content=b"x"), 404)
    check(c.put(snap_url(f"/{unique('b')}/nope", START), content=b"x"), 404)


def test_s2_2_snapshot_over_the_size_limit_is_413(start_server):
    srv = start_server("--max-body-bytes", "4096")
    c = srv.client()
    bucket = unique("b")
    check(c.put(f"/{bucket}"), 201)
    path, o = seeded(c, bucket)
    status, _ = raw_request(srv.url, "PUT", snap_url(path, o[1]),
                            {"Content-Type": SNAP_CT}, b"x" * 5000)
    assert status == 413
    check(latest(c, path), 404)
    snapshot(c, path, o[1], b"x" * 4000, SNAP_CT)


def test_s2_2_publish_does_not_change_retention_or_reads(c, bucket):
    path, o = seeded(c, bucket)
    before = read(c, path, offset="-1")
    snapshot(c, path, o[2], b"SNAPSHOT-BYTES", SNAP_CT)
    after = read(c, path, offset="-1")
    assert after.content == before.content == b"".join(MSGS)
    assert after.headers["stream-next-offset"] == before.headers["stream-next-offset"]
    assert after.headers.get("etag") == before.headers.get("etag")
    assert read_bytes(c, path, START) == b"".join(MSGS)
    assert read_bytes(c, path, o[1]) == b"".join(MSGS[1:])
    assert head(c, path).headers["stream-next-offset"] == o[-1]


def test_s2_2_new_publish_replaces_the_old_one(c, bucket):
    path, o = seeded(c, bucket)
    snapshot(c, path, o[1], b"one", SNAP_CT)
    d2 = snapshot(c, path, o[2], b"two", TEXT).headers["stream-snapshot-digest"]
    check(c.get(snap_url(path, o[1])), 404)
    r = check(c.get(snap_url(path, o[2])), 200)
    assert r.content == b"two" and r.headers["content-type"].startswith(TEXT)
    assert location_path(check(latest(c, path), 307))[-1] == o[2]
    h = head(c, path)
    assert h.headers["stream-snapshot-offset"] == o[2]
    assert h.headers["stream-snapshot-digest"] == d2
    # An earlier offset may also replace a later one while it is retained.
    snapshot(c, path, o[1], b"one again", SNAP_CT)
    check(c.get(snap_url(path, o[2])), 404)
    assert head(c, path).headers["stream-snapshot-offset"] == o[1]


def test_s2_2_appends_after_the_snapshot_do_not_change_it(c, bucket):
    path, o = seeded(c, bucket)
    digest = snapshot(c, path, o[-1], ALL_BYTES, SNAP_CT).headers["stream-snapshot-digest"]
    append(c, path, b"later")
    r = check(c.get(snap_url(path, o[-1])), 200)
    assert r.content == ALL_BYTES
    assert r.headers["stream-snapshot-digest"] == digest
    assert r.headers["stream-up-to-date"] == "false"


def test_s2_2_snapshot_on_a_closed_stream(c, bucket):
    path, o = seeded(c, bucket)
    check(c.post(path, headers={"Stream-Closed": "true"}), 204)
    snapshot(c, path, o[-1], b"final", SNAP_CT)
    assert check(c.get(snap_url(path, o[-1])), 200).content == b"final"


# --- §2.3 read latest ----------------------------------------------------------

def test_s2_3_latest_snapshot_redirects_307(c, bucket):
    path, o = seeded(c, bucket)
    snapshot(c, path, o[2], b"two", SNAP_CT)
    r = check(latest(c, path), 307)
    assert location_path(r)[-4:] == [bucket, "s", "snapshot", o[2]]
    target = c.get(r.headers["location"])
    check(target, 200)
    assert target.content == b"two"


def test_s2_3_latest_snapshot_is_404_when_none(c, bucket):
    path, _ = seeded(c, bucket)
    check(latest(c, path), 404)


def test_s2_3_latest_snapshot_on_missing_stream_is_404(c, bucket):
    check(latest(c, spath(bucket, "nope")), 404)
    check(latest(c, f"/{unique('b')}/nope"), 404)


# --- §2.4 HEAD metadata ----------------------------------------------------------

def test_s2_4_head_has_no_snapshot_headers_without_snapshot(c, bucket):
    path, _ = seeded(c, bucket)
    h = head(c, path)
    assert "stream-snapshot-offset" not in h.headers
    assert "stream-snapshot-digest" not in h.headers


def test_s2_4_head_carries_the_visible_snapshot(c, bucket):
    path, o = seeded(c, bucket)
    digest = snapshot(c, path, o[2], b"two", SNAP_CT).headers["stream-snapshot-digest"]
    h = head(c, path)
    assert h.headers["stream-snapshot-offset"] == o[2]
    assert h.headers["stream-snapshot-digest"] == digest
    assert location_path(check(latest(c, path), 307))[-1] == h.headers["stream-snapshot-offset"]


def test_s2_4_head_drops_snapshot_headers_after_delete(c, bucket):
    path, o = seeded(c, bucket)
    snapshot(c, path, o[2], b"two", SNAP_CT)
    check(c.delete(snap_url(path, o[2])), 204)
    h = head(c, path)
    assert "stream-snapshot-offset" not in h.headers
    assert "stream-snapshot-digest" not in h.headers


# --- §2.5 read snapshot ----------------------------------------------------------

def test_s2_5_read_snapshot_returns_blob_and_headers(c, bucket):
    path, o = seeded(c, bucket)
    body = ALL_BYTES * 3
    digest = snapshot(c, path, o[2], body, SNAP_CT).headers["stream-snapshot-digest"]
    r = check(c.get(snap_url(path, o[2])), 200)
    assert r.content == body
    assert r.headers["content-type"] == SNAP_CT
    assert r.headers["stream-snapshot-offset"] == o[2]
    assert r.headers["stream-snapshot-digest"] == digest
    assert r.headers["stream-next-offset"] == o[2]
    assert r.headers["stream-up-to-date"] == "false"
    # Updates resume at Stream-Next-Offset.
    assert read_bytes(c, path, r.headers["stream-next-offset"]) == MSGS[2]


def test_s2_5_up_to_date_is_true_when_snapshot_is_at_the_tail(c, bucket):
    path, o = seeded(c, bucket)
    snapshot(c, path, o[-1], b"all", SNAP_CT)
    r = check(c.get(snap_url(path, o[-1])), 200)
    assert r.headers["stream-up-to-date"] == "true"
    assert r.headers["stream-next-offset"] == o[-1]
    append(c, path, b"more")
    assert check(c.get(snap_url(path, o[-1])), 200).headers["stream-up-to-date"] == "false"


def test_s2_5_read_of_an_offset_without_snapshot_is_404(c, bucket):
    path, o = seeded(c, bucket)
    check(c.get(snap_url(path, o[1])), 404)
    snapshot(c, path, o[2], b"two", SNAP_CT)
    check(c.get(snap_url(path, o[1])), 404)
    check(c.get(snap_url(path, o[-1])), 404)


def test_s2_5_read_snapshot_of_missing_stream_is_404(c, bucket):
    check(c.get(snap_url(spath(bucket, "nope"), START)), 404)


# --- §2.6 delete snapshot ----------------------------------------------------------

def test_s2_6_delete_visible_snapshot_without_retention_is_204(c, bucket):
    path, o = seeded(c, bucket)
    snapshot(c, path, o[2], b"two", SNAP_CT)
    check(c.delete(snap_url(path, o[2])), 204)
    check(c.get(snap_url(path, o[2])), 404)
    check(latest(c, path), 404)
    assert read_bytes(c, path) == b"".join(MSGS)
    r = check(c.get(f"{path}/bootstrap"), 200)
    assert r.headers["stream-snapshot-offset"] == "-1"
    parts = multipart(r)
    assert parts[0].body == b"" and parts[0].content_type == OCTET
    assert [p.body for p in parts[1:]] == MSGS


def test_s2_6_delete_of_an_offset_that_is_not_the_visible_snapshot_is_404(c, bucket):
    path, o = seeded(c, bucket)
    check(c.delete(snap_url(path, o[1])), 404)
    snapshot(c, path, o[2], b"two", SNAP_CT)
    check(c.delete(snap_url(path, o[1])), 404)
    assert head(c, path).headers["stream-snapshot-offset"] == o[2]


def test_s2_6_delete_of_a_superseded_snapshot_is_404(c, bucket):
    path, o = seeded(c, bucket)
    snapshot(c, path, o[1], b"one", SNAP_CT)
    snapshot(c, path, o[2], b"two", SNAP_CT)
    check(c.delete(snap_url(path, o[1])), 404)
    assert check(c.get(snap_url(path, o[2])), 200).content == b"two"


def test_s2_6_delete_visible_snapshot_after_retention_is_409(c, bucket):
    path, o = seeded(c, bucket)
    digest = snapshot(c, path, o[2], b"two", SNAP_CT).headers["stream-snapshot-digest"]
    retain(c, path, o[1])
    check(c.delete(snap_url(path, o[2])), 409)
    r = check(c.get(snap_url(path, o[2])), 200)
    assert r.headers["stream-snapshot-digest"] == digest
    assert head(c, path).headers["stream-snapshot-offset"] == o[2]


def test_s2_6_delete_twice_is_404(c, bucket):
    path, o = seeded(c, bucket)
    snapshot(c, path, o[1], b"one", SNAP_CT)
    check(c.delete(snap_url(path, o[1])), 204)
    check(c.delete(snap_url(path, o[1])), 404)


def test_s2_6_delete_snapshot_of_missing_stream_is_404(c, bucket):
    check(c.delete(snap_url(spath(bucket, "nope"), START)), 404)


# --- §2.2 retention --------------------------------------------------------------

def test_s2_2_retention_is_204_and_older_offsets_are_410(c, bucket):
    path, o = seeded(c, bucket)
    snapshot(c, path, o[2], b"two", SNAP_CT)
    check(c.put(f"{path}/retention/{seg(o[2])}"), 204)
    for gone in (START, o[1]):
        check(c.get(path, params={"offset": gone}), 410)
    assert read_bytes(c, path, o[2]) == MSGS[2]
    assert read_bytes(c, path, o[-1]) == b""


def test_s2_2_after_retention_reads_from_minus_one_start_at_the_retained_offset(c, bucket):
    path, o = seeded(c, bucket)
    snapshot(c, path, o[2], b"two", SNAP_CT)
    retain(c, path, o[1])
    r = read(c, path, offset="-1")
    assert r.content == b"".join(MSGS[1:])
    assert r.headers["stream-next-offset"] == o[-1]
    assert check(c.get(path), 200).content == b"".join(MSGS[1:])


def test_s2_2_live_reads_below_retention_are_410(c, bucket):
    path, o = seeded(c, bucket)
    snapshot(c, path, o[2], b"two", SNAP_CT)
    retain(c, path, o[2])
    check(c.get(path, params={"offset": o[1], "live": "long-poll"}), 410)
    check(peek(c, path, offset=START, live="sse"), 410)


def test_s2_2_retention_at_or_before_the_snapshot_is_allowed(c, bucket):
    path, o = seeded(c, bucket)
    snapshot(c, path, o[-1], b"all", SNAP_CT)
    retain(c, path, o[1])
    retain(c, path, o[2])
    retain(c, path, o[-1])
    check(c.get(path, params={"offset": o[2]}), 410)
    assert read_bytes(c, path) == b""
    append(c, path, b"new")
    assert read_bytes(c, path) == b"new"


def test_s2_2_retention_newer_than_the_snapshot_is_409(c, bucket):
    path, o = seeded(c, bucket)
    snapshot(c, path, o[1], b"one", SNAP_CT)
    retain(c, path, o[2], status=409)
    assert read_bytes(c, path, START) == b"".join(MSGS)


def test_s2_2_retention_without_a_snapshot_is_409(c, bucket):
    path, o = seeded(c, bucket)
    retain(c, path, o[1], status=409)
    assert read_bytes(c, path, START) == b"".join(MSGS)


def test_s2_2_retention_moving_backward_is_409(c, bucket):
    path, o = seeded(c, bucket)
    snapshot(c, path, o[2], b"two", SNAP_CT)
    retain(c, path, o[2])
    retain(c, path, o[1], status=409)
    check(c.get(path, params={"offset": o[1]}), 410)


def test_s2_2_retention_beyond_the_tail_is_409(c, bucket):
    path, o = seeded(c, bucket)
    snapshot(c, path, o[-1], b"all", SNAP_CT)
    total = sum(len(m) for m in MSGS)
    retain(c, path, forge_offset(len(MSGS) + 5, total + 100), status=409)
    assert read_bytes(c, path, START) == b"".join(MSGS)


@pytest.mark.parametrize("bad", ["abc", "12", "0000000000000001-0000000000000010"])
def test_s2_2_malformed_retention_offset_is_400(c, bucket, bad):
    path, o = seeded(c, bucket)
    snapshot(c, path, o[-1], b"all", SNAP_CT)
    check(c.put(f"{path}/retention/{seg(bad)}"), 400)


def test_s2_2_retention_not_on_a_message_boundary_is_400(c, bucket):
    path, o = seeded(c, bucket)
    snapshot(c, path, o[-1], b"all", SNAP_CT)
    check(c.put(f"{path}/retention/{seg(forge_offset(1, len(MSGS[0]) + 2))}"), 400)
    assert read_bytes(c, path, START) == b"".join(MSGS)


def test_s2_2_retention_on_missing_stream_is_404(c, bucket):
    check(c.put(f"{spath(bucket, 'nope')}/retention/{START}"), 404)


def test_s2_2_retention_keeps_head_and_appends_working(c, bucket):
    path, o = seeded(c, bucket)
    snapshot(c, path, o[2], b"two", SNAP_CT)
    retain(c, path, o[2])
    assert head(c, path).headers["stream-next-offset"] == o[-1]
    tail = append(c, path, b"four").headers["stream-next-offset"]
    assert read_bytes(c, path, o[2]) == MSGS[2] + b"four"
    assert read_bytes(c, path) == MSGS[2] + b"four"
    assert head(c, path).headers["stream-next-offset"] == tail


# --- record-addressed snapshot and retention (JSON streams) ------------------------

def json_stream(c, bucket, values, name="j"):
    """A JSON stream with one POST per value; returns (path, offsets) with
    offsets[r] = O(r) and offsets[-1] the tail."""
    path = spath(bucket, name)
    create_stream(c, path, JSON_CT)
    offsets = [next_offset(c, path)]
    for v in values:
        offsets.append(append(c, path, json.dumps(v), JSON_CT).headers["stream-next-offset"])
    return path, offsets


def test_s2_2_snapshot_by_record_on_a_json_stream(c, bucket):
    values = [{"n": i} for i in range(5)]
    path, o = json_stream(c, bucket, values)
    r = check(c.put(f"{path}/snapshot", params={"record": "3"}, content=b'{"sum":3}',
                    headers={"Content-Type": JSON_CT}), 204)
    digest = r.headers["stream-snapshot-digest"]
    h = head(c, path)
    assert h.headers["stream-snapshot-offset"] == o[3]
    assert h.headers["stream-snapshot-digest"] == digest
    s = check(c.get(snap_url(path, o[3])), 200)
    assert s.content == b'{"sum":3}'
    assert s.headers["stream-next-offset"] == o[3]
    # The same content at the same record is an idempotent repeat.
    r2 = check(c.put(f"{path}/snapshot", params={"record": "3"}, content=b'{"sum":3}',
                     headers={"Content-Type": JSON_CT}), 204)
    assert r2.headers["stream-snapshot-digest"] == digest


def test_s2_2_snapshot_by_record_at_the_tail_and_inside_one_append(c, bucket):
    path = spath(bucket, "j")
    create_stream(c, path, JSON_CT, body=[1, 2, 3])  # one append unit, three records
    check(c.put(f"{path}/snapshot", params={"record": "1"}, content=b"s1"), 204)
    r = read(c, path, record="0", max_records="1")
    assert head(c, path).headers["stream-snapshot-offset"] == r.headers["stream-next-offset"]
    check(c.put(f"{path}/snapshot", params={"record": "3"}, content=b"s3"), 204)
    assert head(c, path).headers["stream-snapshot-offset"] == next_offset(c, path)


def test_s2_2_retention_by_record_on_a_json_stream(c, bucket):
    values = [{"n": i} for i in range(5)]
    path, o = json_stream(c, bucket, values)
    check(c.put(f"{path}/snapshot", params={"record": "3"}, content=b"s"), 204)
    check(c.put(f"{path}/retention", params={"record": "2"}), 204)
    h = head(c, path)
    assert h.headers["stream-record-first"] == "2"
    assert h.headers["stream-record-next"] == "5"
    check(c.get(path, params={"offset": o[1]}), 410)
    assert read(c, path, offset=o[2]).json() == values[2:]
    check(c.get(path, params={"record": "1"}), 410)
    # Newer than the snapshot, and moving backward, are both refused.
    check(c.put(f"{path}/retention", params={"record": "4"}), 409)
    check(c.put(f"{path}/retention", params={"record": "1"}), 409)


@pytest.mark.parametrize("op", ["snapshot", "retention"])
def test_s2_2_record_variant_beyond_the_tail_is_409(c, bucket, op):
    # As for an offset beyond the tail: the boundary does not exist yet.
    path, _ = json_stream(c, bucket, [1, 2, 3])
    check(c.put(f"{path}/snapshot", params={"record": "3"}, content=b"s"), 204)
    check(c.put(f"{path}/{op}", params={"record": "4"}, content=b"s"), 409)


def test_s6_10_snapshot_and_bootstrap_record_headers_match_their_offsets(c, bucket):
    values = [{"n": i} for i in range(5)]
    path, o = json_stream(c, bucket, values)
    check(c.put(f"{path}/snapshot", params={"record": "2"}, content=b"s"), 204)
    assert head(c, path).headers["stream-record-first"] == "0"
    s = check(c.get(snap_url(path, o[2])), 200)
    # Stream-Record-Next names the boundary Stream-Next-Offset does: the snapshot's.
    assert s.headers["stream-next-offset"] == o[2]
    assert (s.headers["stream-record-first"], s.headers["stream-record-next"]) == ("0", "2")
    b = check(c.get(f"{path}/bootstrap"), 200)
    assert b.headers["stream-next-offset"] == o[5]
    assert (b.headers["stream-record-first"], b.headers["stream-record-next"]) == ("0", "5")


@pytest.mark.parametrize("op", ["snapshot", "retention"])
@pytest.mark.parametrize("bad", ["abc", "-1", "1.5", ""])
def test_s2_2_record_variant_with_a_malformed_record_is_400(c, bucket, op, bad):
    path, _ = json_stream(c, bucket, [1, 2, 3])
    check(c.put(f"{path}/snapshot", params={"record": "3"}, content=b"s"), 204)
    check(c.put(f"{path}/{op}", params={"record": bad}, content=b"s"), 400)


@pytest.mark.parametrize("op", ["snapshot", "retention"])
def test_s2_2_record_variant_on_a_non_json_stream_is_400(c, bucket, op):
    path, o = seeded(c, bucket)
    snapshot(c, path, o[-1], b"all", SNAP_CT)
    check(c.put(f"{path}/{op}", params={"record": "1"}, content=b"s"), 400)
    assert head(c, path).headers["stream-snapshot-offset"] == o[-1]
    assert read_bytes(c, path, START) == b"".join(MSGS)
