"""Seed 000 §8: URL encoding. Snapshot offsets in path segments are
percent-decoded by the server; stream ids with spaces, reserved characters or
non-ASCII text work percent-encoded and list back decoded."""

import json

import pytest

from helpers import (OCTET, TEXT, append, append_all, check, create_stream, head, location_path,
                     multipart, next_offset, read_bytes, seg, spath)


def encode_all(text):
    """Percent-encodes every character, even unreserved ones."""
    return "".join(f"%{b:02X}" for b in text.encode())


def test_s8_snapshot_offset_fully_percent_encoded_in_the_path(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, OCTET)
    o = append_all(c, path, [b"a", b"b", b"c"])
    r = check(c.put(f"{path}/snapshot/{encode_all(o[2])}", content=b"snap"), 204)
    digest = r.headers["stream-snapshot-digest"]
    assert head(c, path).headers["stream-snapshot-offset"] == o[2]
    for form in (o[2], seg(o[2]), encode_all(o[2])):
        got = check(c.get(f"{path}/snapshot/{form}"), 200)
        assert got.content == b"snap"
        assert got.headers["stream-snapshot-offset"] == o[2]
        assert got.headers["stream-snapshot-digest"] == digest
    # Same content at the same (encoded) offset is an idempotent repeat.
    again = check(c.put(f"{path}/snapshot/{o[2]}", content=b"snap"), 204)
    assert again.headers["stream-snapshot-digest"] == digest
    check(c.put(f"{path}/retention/{encode_all(o[1])}"), 204)
    check(c.get(path, params={"offset": o[0]}), 410)
    check(c.delete(f"{path}/snapshot/{encode_all(o[2])}"), 409)


def test_s8_delete_snapshot_with_an_encoded_offset(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, OCTET, body=b"x")
    tail = next_offset(c, path)
    check(c.put(f"{path}/snapshot/{tail}", content=b"snap"), 204)
    check(c.delete(f"{path}/snapshot/{encode_all(tail)}"), 204)
    check(c.get(f"{path}/snapshot"), 404)


def test_s8_snapshot_location_is_a_valid_encoded_url(c, bucket):
    name = "my stream ü?#%+"
    path = spath(bucket, name)
    create_stream(c, path, OCTET, body=b"x")
    tail = next_offset(c, path)
    check(c.put(f"{path}/snapshot/{seg(tail)}", content=b"snap"), 204)
    r = check(c.get(f"{path}/snapshot"), 307)
    assert location_path(r)[-4:] == [bucket, name, "snapshot", tail]
    loc = r.headers["location"]
    assert " " not in loc and "#" not in loc.split("/snapshot/")[0]
    followed = check(c.get(loc), 200)
    assert followed.content == b"snap"


STREAM_NAMES = ["with space", "ünïcödé", "данные", "日本語", "emoji 😀", "a+b", "a?b",
                "a#b", "a%b", "a&b=c", "semi;colon", "quote\"s", "tab\tch", "~tilde", "percent%2F"]


@pytest.mark.parametrize("name", STREAM_NAMES)
def test_s8_stream_ids_are_percent_decoded(c, bucket, name):
    path = spath(bucket, name)
    create_stream(c, path, TEXT, body=b"hello")
    append(c, path, b"!", TEXT)
    assert read_bytes(c, path) == b"hello!"
    head(c, path)
    body = check(c.get(f"/{bucket}/streams"), 200).json()
    assert [s["stream_id"] for s in body["streams"]] == [name]
    assert body["streams"][0]["tail_offset"] == 6
    check(c.put(f"{path}/attrs", content=json.dumps({"title": name}),
                headers={"Content-Type": "application/json"}), 204)
    assert check(c.get(f"{path}/attrs"), 200).json() == {"title": name}
    parts = multipart(check(c.get(f"{path}/bootstrap"), 200))
    assert [p.body for p in parts[1:]] == [b"hello", b"!"]
    check(c.delete(path), 204)
    check(c.head(path), 404)


def test_s8_listing_prefix_and_after_are_decoded(c, bucket):
    names = ["my docs", "my dogs", "my-docs", "ünï a", "ünï b"]
    for name in names:
        create_stream(c, spath(bucket, name), TEXT)
    body = check(c.get(f"/{bucket}/streams", params={"prefix": "my d"}), 200).json()
    assert body["prefix"] == "my d"
    assert [s["stream_id"] for s in body["streams"]] == ["my docs", "my dogs"]
    body = check(c.get(f"/{bucket}/streams", params={"prefix": "ünï", "limit": "1"}), 200).json()
    assert [s["stream_id"] for s in body["streams"]] == ["ünï a"]
    assert body["next_cursor"] == "ünï a"
    body = check(c.get(f"/{bucket}/streams", params={"prefix": "ünï", "after": "ünï a"}),
                 200).json()
    assert [s["stream_id"] for s in body["streams"]] == ["ünï b"]


def test_s8_fork_source_header_with_an_encoded_stream_id(c, bucket):
    create_stream(c, spath(bucket, "source stream ü"), TEXT, body=b"data")
    create_stream(c, spath(bucket, "fork"), TEXT,
                  headers={"Stream-Forked-From": f"/{bucket}/{seg('source stream ü')}"})
    assert read_bytes(c, spath(bucket, "fork")) == b"data"
