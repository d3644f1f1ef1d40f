"""Seed 000 §7: ordinary SSE compatibility. Binary streams send base64 `data`
events with `stream-sse-data-encoding: base64`, on both surfaces; text and
JSON streams do not; control events stay JSON."""

import base64

import pytest

from helpers import (ALL_BYTES, JSON_CT, OCTET, SSE, TEXT, append, check, controls, create_stream,
                     data_events, frames, next_offset, retain, snapshot, spath, unique)


@pytest.fixture(params=["bucketed", "base"])
def surface(request, c):
    if request.param == "bucketed":
        bucket = unique("b")
        check(c.put(f"/{bucket}"), 201)
        return lambda name="s": spath(bucket, name)
    prefix = unique("sse")
    return lambda name="s": f"/v1/stream/{prefix}/{name}"


def decoded(events):
    """The bytes of every data event, base64-decoded (line breaks removed)."""
    out = b""
    for e in data_events(events):
        text = e.data.replace("\n", "").replace("\r", "")
        assert len(text) % 4 == 0, f"base64 text length not a multiple of 4: {text!r}"
        out += base64.b64decode(text, validate=True)
    return out


@pytest.mark.parametrize("content_type", [OCTET, "application/x-protobuf", "image/png"])
def test_s7_binary_stream_sse_is_base64(c, surface, content_type):
    path = surface()
    create_stream(c, path, content_type, body=ALL_BYTES)
    append(c, path, b"\x00\r\n\xff", content_type)
    with SSE(c, path, offset="-1", live="sse") as s:
        check(s.response, 200)
        assert s.response.headers["content-type"].startswith("text/event-stream")
        assert s.response.headers.get("stream-sse-data-encoding") == "base64"
        events = s.until_up_to_date()
    assert decoded(events) == ALL_BYTES + b"\x00\r\n\xff"
    ctl = controls(events)[-1]
    assert ctl["streamNextOffset"] == next_offset(c, path)


def test_s7_binary_live_appends_arrive_base64(c, surface):
    path = surface()
    create_stream(c, path, OCTET)
    with SSE(c, path, offset="-1", live="sse") as s:
        assert s.response.headers.get("stream-sse-data-encoding") == "base64"
        s.until_up_to_date()
        append(c, path, ALL_BYTES[::-1])
        tail = next_offset(c, path)
        events = s.until(lambda e: e.type == "control" and e.json()["streamNextOffset"] == tail)
    assert decoded(events) == ALL_BYTES[::-1]


@pytest.mark.parametrize("content_type", [TEXT, "text/markdown", JSON_CT])
def test_s7_text_and_json_streams_are_not_base64(c, surface, content_type):
    path = surface()
    body = b'{"k":"v"}' if content_type == JSON_CT else "héllo".encode()
    create_stream(c, path, content_type, body=body)
    with SSE(c, path, offset="-1", live="sse") as s:
        assert "stream-sse-data-encoding" not in s.response.headers
        events = s.until_up_to_date()
    text = "".join(e.data for e in data_events(events))
    if content_type == JSON_CT:
        assert '"k"' in text
    else:
        assert text == "héllo"


def test_s7_append_batch_data_reads_as_ordinary_binary_sse(c):
    bucket = unique("b")
    check(c.put(f"/{bucket}"), 201)
    path = spath(bucket, "s")
    create_stream(c, path, OCTET)
    check(c.post(f"{path}/append-batch", content=frames(b"\x01\x02", ALL_BYTES),
                 headers={"Content-Type": OCTET}), 200)
    with SSE(c, path, offset="-1", live="sse") as s:
        assert s.response.headers.get("stream-sse-data-encoding") == "base64"
        events = s.until_up_to_date()
    assert decoded(events) == b"\x01\x02" + ALL_BYTES


def test_s7_binary_sse_after_retention_starts_at_the_retained_offset(c):
    bucket = unique("b")
    check(c.put(f"/{bucket}"), 201)
    path = spath(bucket, "s")
    create_stream(c, path, OCTET, body=b"old")
    mid = next_offset(c, path)
    append(c, path, b"\xfe\xffnew")
    snapshot(c, path, mid, b"snap")
    retain(c, path, mid)
    with SSE(c, path, offset="-1", live="sse") as s:
        assert s.response.headers.get("stream-sse-data-encoding") == "base64"
        events = s.until_up_to_date()
    assert decoded(events) == b"\xfe\xffnew"
