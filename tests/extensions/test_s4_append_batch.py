"""Seed 000 §4 (and §6.11): Append Batch. Frames are `uint32_be len | payload`;
each frame is its own append with its own acknowledgement."""

import struct
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import (ALL_BYTES, JSON_CT, OCTET, RECORDS_TOKEN, TEXT, append, append_all, check,
                     create_stream, describe, extension_tokens, frames, head, multipart,
                     next_offset, raw_request, read, read_bytes, spath, unique)


def batch(c, path, body, content_type=OCTET, headers=None, status=200):
    h = {"Content-Type": content_type} if content_type else {}
    h.update(headers or {})
    r = check(c.post(f"{path}/append-batch", content=body, headers=h), status)
    if status == 200:
        assert r.headers["content-type"].startswith("application/json"), describe(r)
        acks = r.json()
        assert isinstance(acks, list), describe(r)
        return acks
    return r


def assert_ok(ack):
    assert ack["status"] == 204, ack
    assert isinstance(ack["stream_next_offset"], str), ack


def assert_failed(ack, status):
    assert ack["status"] == status, ack
    assert isinstance(ack.get("error_code"), str) and ack["error_code"], ack
    assert isinstance(ack.get("error"), str) and ack["error"], ack


def new_stream(c, bucket, content_type=OCTET, name="s", body=None):
    path = spath(bucket, name)
    create_stream(c, path, content_type, body=body)
    return path


# --- §4.3 response ---------------------------------------------------------------

def test_s4_3_batch_acknowledges_every_frame_in_order(c, bucket):
    path = new_stream(c, bucket)
    payloads = [b"one", ALL_BYTES, b"three"]
    acks = batch(c, path, frames(*payloads))
    assert len(acks) == 3
    for ack in acks:
        assert_ok(ack)
    offs = [a["stream_next_offset"] for a in acks]
    assert offs == sorted(offs) and len(set(offs)) == 3
    assert offs[-1] == next_offset(c, path)
    assert read_bytes(c, path) == b"".join(payloads)
    assert read_bytes(c, path, offs[0]) == ALL_BYTES + b"three"
    assert read_bytes(c, path, offs[1]) == b"three"


def test_s4_3_byte_stream_acks_have_no_record_fields(c, bucket):
    path = new_stream(c, bucket)
    r = c.post(f"{path}/append-batch", content=frames(b"a", b"b"), headers={"Content-Type": OCTET})
    check(r, 200)
    assert RECORDS_TOKEN not in extension_tokens(r)
    for ack in r.json():
        assert "stream_record_start" not in ack and "stream_record_next" not in ack


def test_s4_4_batch_offsets_equal_those_of_single_posts(c, bucket):
    payloads = [b"a", b"bb", ALL_BYTES, b"dddd"]
    by_post = new_stream(c, bucket, name="posts")
    expected = append_all(c, by_post, payloads)[1:]
    by_batch = new_stream(c, bucket, name="batch")
    acks = batch(c, by_batch, frames(*payloads))
    assert [a["stream_next_offset"] for a in acks] == expected
    assert read_bytes(c, by_batch) == read_bytes(c, by_post)


def test_s4_4_batch_continues_after_ordinary_appends(c, bucket):
    path = new_stream(c, bucket, body=b"start-")
    acks = batch(c, path, frames(b"x", b"y"))
    append(c, path, b"-end")
    assert read_bytes(c, path) == b"start-xy-end"
    assert read_bytes(c, path, acks[0]["stream_next_offset"]) == b"y-end"


def test_s4_4_batch_frames_are_separate_messages(c, bucket):
    path = new_stream(c, bucket)
    batch(c, path, frames(b"f1", b"f2\r\n", b"f3"))
    parts = multipart(check(c.get(f"{path}/bootstrap"), 200))
    assert [p.body for p in parts[1:]] == [b"f1", b"f2\r\n", b"f3"]


def test_s4_4_batch_on_a_text_stream(c, bucket):
    path = new_stream(c, bucket, TEXT)
    acks = batch(c, path, frames("héllo ", "wörld"), TEXT)
    assert [a["status"] for a in acks] == [204, 204]
    assert read(c, path).content.decode() == "héllo wörld"


def test_s4_4_batch_wakes_a_long_poll_reader(c, bucket):
    path = new_stream(c, bucket, body=b"x")
    tail = next_offset(c, path)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(c.get, path, params={"offset": tail, "live": "long-poll"})
        batch(c, path, frames(b"woke", b"up"))
        r = waiting.result(timeout=10)
    check(r, 200)
    assert r.content in (b"woke", b"wokeup")
    assert read_bytes(c, path, tail) == b"wokeup"


def test_s6_11_json_frames_are_separate_records_with_ranges(c, bucket):
    path = new_stream(c, bucket, JSON_CT)
    r = c.post(f"{path}/append-batch", content=frames('{"a":1}', '{"b":2}'),
               headers={"Content-Type": JSON_CT})
    check(r, 200)
    assert RECORDS_TOKEN in extension_tokens(r), "record ranges come with the token"
    acks = r.json()
    for ack in acks:
        assert_ok(ack)
    assert [(a["stream_record_start"], a["stream_record_next"]) for a in acks] == [(0, 1), (1, 2)]
    assert read(c, path).json() == [{"a": 1}, {"b": 2}]
    h = head(c, path)
    assert h.headers["stream-record-next"] == "2"


def test_s6_11_json_frame_with_an_array_gets_one_record_per_element(c, bucket):
    path = new_stream(c, bucket, JSON_CT, body=[0])
    acks = batch(c, path, frames("[1,2,3]", "[[4,5]]", "6"), JSON_CT)
    assert [(a["stream_record_start"], a["stream_record_next"]) for a in acks] == \
        [(1, 4), (4, 5), (5, 6)]
    assert read(c, path).json() == [0, 1, 2, 3, [4, 5], 6]


def test_s4_3_invalid_json_frame_fails_alone(c, bucket):
    path = new_stream(c, bucket, JSON_CT)
    acks = batch(c, path, frames('{"ok":1}', '{"broken":', '{"ok":2}'), JSON_CT)
    assert len(acks) == 3
    assert_ok(acks[0])
    assert_failed(acks[1], 400)
    assert_ok(acks[2])
    # A failed frame takes no ordinal; later frames continue from the tail.
    assert (acks[0]["stream_record_start"], acks[0]["stream_record_next"]) == (0, 1)
    assert (acks[2]["stream_record_start"], acks[2]["stream_record_next"]) == (1, 2)
    assert read(c, path).json() == [{"ok": 1}, {"ok": 2}]
    assert acks[2]["stream_next_offset"] == next_offset(c, path)


def test_s4_3_empty_json_array_frame_fails_alone(c, bucket):
    path = new_stream(c, bucket, JSON_CT)
    acks = batch(c, path, frames("[]", "1"), JSON_CT)
    assert_failed(acks[0], 400)
    assert_ok(acks[1])
    assert read(c, path).json() == [1]


def test_s4_3_frames_on_a_closed_stream_report_409_stream_closed(c, bucket):
    path = new_stream(c, bucket, body=b"x")
    check(c.post(path, headers={"Stream-Closed": "true"}), 204)
    tail = next_offset(c, path)
    acks = batch(c, path, frames(b"a", b"b"))
    assert len(acks) == 2
    for ack in acks:
        assert_failed(ack, 409)
        assert ack.get("stream_closed") is True, ack
        if "stream_next_offset" in ack:
            assert ack["stream_next_offset"] == tail
    assert read_bytes(c, path) == b"x"


# --- §4.1 / §4.2 whole-request errors -----------------------------------------------------

def test_s4_1_missing_content_type_is_400(c, bucket):
    path = new_stream(c, bucket)
    r = c.post(f"{path}/append-batch", content=frames(b"a"))
    assert "content-type" not in r.request.headers
    check(r, 400)
    assert read_bytes(c, path) == b""


def test_s4_1_content_type_not_matching_the_stream_is_409(c, bucket):
    path = new_stream(c, bucket, TEXT)
    batch(c, path, frames(b"a"), OCTET, status=409)
    batch(c, path, frames(b"a"), JSON_CT, status=409)
    assert read_bytes(c, path) == b""


def test_s4_1_zero_length_frame_is_400(c, bucket):
    path = new_stream(c, bucket)
    batch(c, path, frames(b"ok", b"", b"x"), status=400)
    assert read_bytes(c, path) == b""


@pytest.mark.parametrize("body", [
    struct.pack(">I", 10) + b"12345",                # payload shorter than its length
    frames(b"ok") + b"\x00\x00",                     # partial length prefix
    frames(b"ok") + struct.pack(">I", 5),            # length with no payload
    b"\x00",                                         # one byte
], ids=["short-payload", "partial-length", "missing-payload", "one-byte"])
def test_s4_1_truncated_framing_is_400(c, bucket, body):
    path = new_stream(c, bucket)
    batch(c, path, body, status=400)
    assert read_bytes(c, path) == b""


def test_s4_1_512_frames_are_accepted(c, bucket):
    path = new_stream(c, bucket)
    payloads = [b"%d," % i for i in range(512)]
    acks = batch(c, path, frames(*payloads))
    assert len(acks) == 512
    assert all(a["status"] == 204 for a in acks)
    assert read_bytes(c, path) == b"".join(payloads)


def test_s4_1_more_than_512_frames_is_413(c, bucket):
    path = new_stream(c, bucket)
    batch(c, path, frames(*[b"x"] * 513), status=413)
    assert read_bytes(c, path) == b""


def test_s4_1_body_over_32_mib_is_413(server, c, bucket):
    path = new_stream(c, bucket)
    frame = b"z" * (11 * 1024 * 1024)
    body = frames(frame, frame, frame)  # 33 MiB and 12 bytes of framing
    status, _ = raw_request(server.url, "POST", f"{path}/append-batch",
                            {"Content-Type": OCTET}, body)
    assert status == 413
    assert read_bytes(c, path) == b""


@pytest.mark.parametrize("headers", [
    {"Stream-Closed": "true"},
    {"Producer-Id": "p1", "Producer-Epoch": "0", "Producer-Seq": "0"},
    {"Producer-Id": "p1"},
    {"Stream-Record-Match": "0"},
    {"Stream-Seq": "0001"},
], ids=["stream-closed", "producer", "producer-id-only", "record-match", "stream-seq"])
def test_s4_2_per_append_controls_are_400(c, bucket, headers):
    content_type = JSON_CT if "Stream-Record-Match" in headers else OCTET
    path = new_stream(c, bucket, content_type)
    batch(c, path, frames(b"1"), content_type, headers=headers, status=400)
    h = head(c, path)
    assert "stream-closed" not in h.headers
    assert read(c, path).content in (b"", b"[]")


@pytest.mark.parametrize("value", ["false", "", "1", "yes"])
def test_s4_2_a_stream_closed_header_other_than_true_is_ignored_as_absent(c, bucket, value):
    path = new_stream(c, bucket, OCTET)
    batch(c, path, frames(b"a"), OCTET, headers={"Stream-Closed": value}, status=200)
    assert "stream-closed" not in head(c, path).headers
    assert read(c, path).content == b"a"


def test_s4_1_batch_on_missing_stream_is_404(c, bucket):
    batch(c, spath(bucket, "nope"), frames(b"a"), status=404)
    batch(c, f"/{unique('b')}/nope", frames(b"a"), status=404)


def test_s4_a_batch_holds_at_most_100000_json_messages_in_all(c, bucket):
    path = new_stream(c, bucket, JSON_CT)
    half = "[" + ",".join(["0"] * 50_001) + "]"
    r = batch(c, path, frames(half, half), JSON_CT, status=400)
    assert "100000" in r.text, describe(r)
    assert read(c, path).json() == [], "nothing of the batch was appended"
    acks = batch(c, path, frames(half), JSON_CT)
    assert_ok(acks[0])
