"""Seed 000 §5: stream attributes. `Stream-Attrs` on create (both surfaces),
GET / PUT {stream}/attrs on the bucketed surface."""

import json
import time

import pytest

from helpers import (JSON_CT, OCTET, TEXT, append, check, create_stream, head, multipart,
                     next_offset, read, snapshot, spath, unique)

ATTRS = {"title": "Support session",
         "metadata": {"purpose": "customer-support",
                      "agent": {"id": "agent_1", "version": 2}}}
LIMIT = 16 * 1024


def attrs_header(value):
    return {"Stream-Attrs": value if isinstance(value, str) else json.dumps(value)}


def get_attrs(c, path):
    r = check(c.get(f"{path}/attrs"), 200)
    assert r.headers["content-type"].startswith("application/json"), r.headers
    return r.json()


def put_attrs(c, path, body, content_type=JSON_CT, status=204):
    if not isinstance(body, (str, bytes)):
        body = json.dumps(body)
    h = {"Content-Type": content_type} if content_type else {}
    return check(c.put(f"{path}/attrs", content=body, headers=h), status)


def big_attrs(size):
    """An attribute object whose compact JSON encoding is `size` bytes."""
    base = {"metadata": {"blob": ""}}
    pad = size - len(json.dumps(base, separators=(",", ":")))
    return {"metadata": {"blob": "x" * pad}}


INVALID = {
    "not-json": "not json",
    "truncated": '{"title":',
    "array": "[1,2]",
    "string": '"title"',
    "number": "42",
    "null": "null",
    "title-not-string": '{"title":5}',
    "title-object": '{"title":{"a":1}}',
    "metadata-string": '{"metadata":"x"}',
    "metadata-array": '{"metadata":[1]}',
    "metadata-number": '{"metadata":1}',
}


# --- §5.2 create with attributes ----------------------------------------------------

def test_s5_2_create_with_stream_attrs_stores_them(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, TEXT, headers=attrs_header(ATTRS))
    assert get_attrs(c, path) == ATTRS


@pytest.mark.parametrize("case", list(INVALID))
def test_s5_2_invalid_stream_attrs_is_400(c, bucket, case):
    path = spath(bucket, "s")
    check(c.put(path, headers={"Content-Type": TEXT, **attrs_header(INVALID[case])}), 400)
    check(c.head(path), 404)


def test_s5_2_stream_attrs_over_16_kib_is_400(c, bucket):
    path = spath(bucket, "s")
    check(c.put(path, headers={"Content-Type": TEXT,
                               **attrs_header(json.dumps(big_attrs(LIMIT + 1),
                                                         separators=(",", ":")))}), 400)
    check(c.head(path), 404)


def test_s5_2_stream_attrs_just_under_16_kib_is_accepted(c, bucket):
    path = spath(bucket, "s")
    value = big_attrs(LIMIT - 64)
    create_stream(c, path, TEXT,
                  headers=attrs_header(json.dumps(value, separators=(",", ":"))))
    assert get_attrs(c, path) == value


def test_s5_2_idempotent_create_with_the_same_attrs_is_200(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, TEXT, headers=attrs_header(ATTRS))
    create_stream(c, path, TEXT, headers=attrs_header(ATTRS), status=200)
    # Same object, other key order and whitespace.
    reordered = ('{ "metadata" : {"agent": {"version": 2, "id": "agent_1"}, '
                 '"purpose": "customer-support"}, "title": "Support session" }')
    create_stream(c, path, TEXT, headers=attrs_header(reordered), status=200)


def test_s5_2_idempotent_create_with_other_attrs_is_409(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, TEXT, headers=attrs_header(ATTRS))
    create_stream(c, path, TEXT, headers=attrs_header({"title": "Other"}), status=409)
    create_stream(c, path, TEXT, headers=attrs_header({**ATTRS, "title": "X"}), status=409)
    assert get_attrs(c, path) == ATTRS


def test_s5_2_idempotent_create_without_attrs_on_a_stream_with_attrs_is_409(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, TEXT, headers=attrs_header(ATTRS))
    create_stream(c, path, TEXT, status=409)
    create_stream(c, path, TEXT, headers=attrs_header({}), status=409)


def test_s5_2_empty_attrs_equal_no_attrs(c, bucket):
    a, b = spath(bucket, "a"), spath(bucket, "b")
    create_stream(c, a, TEXT)
    create_stream(c, a, TEXT, headers=attrs_header({}), status=200)
    create_stream(c, b, TEXT, headers=attrs_header({}))
    create_stream(c, b, TEXT, status=200)
    assert get_attrs(c, a) == {} and get_attrs(c, b) == {}
    create_stream(c, a, TEXT, headers=attrs_header({"title": "t"}), status=409)


def test_s5_2_unknown_top_level_fields_are_accepted_and_dropped(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, TEXT, headers=attrs_header({"title": "t", "extra": [1, 2],
                                                        "owner": {"x": 1}}))
    assert get_attrs(c, path) == {"title": "t"}
    create_stream(c, path, TEXT, headers=attrs_header({"title": "t"}), status=200)
    create_stream(c, path, TEXT, headers=attrs_header({"title": "t", "other": True}),
                  status=200)


def test_s5_2_only_unknown_fields_equal_no_attrs(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, TEXT, headers=attrs_header({"extra": 1}))
    assert get_attrs(c, path) == {}
    create_stream(c, path, TEXT, status=200)


def test_s5_2_stream_attrs_on_the_base_surface(c):
    path = f"/v1/stream/{unique('attrs')}/s"
    create_stream(c, path, TEXT, headers=attrs_header(ATTRS))
    create_stream(c, path, TEXT, headers=attrs_header(ATTRS), status=200)
    create_stream(c, path, TEXT, headers=attrs_header({"title": "Other"}), status=409)
    create_stream(c, path, TEXT, status=409)
    check(c.put(f"/v1/stream/{unique('attrs')}/bad",
                headers={"Content-Type": TEXT, **attrs_header("[1]")}), 400)


def test_s5_2_attrs_with_a_json_stream_and_initial_data(c, bucket):
    path = spath(bucket, "j")
    create_stream(c, path, JSON_CT, body=[{"n": 1}], headers=attrs_header({"title": "J"}))
    assert get_attrs(c, path) == {"title": "J"}
    assert read(c, path).json() == [{"n": 1}]


# --- §5.3 read -----------------------------------------------------------------------

def test_s5_3_attrs_of_a_stream_without_attrs_are_an_empty_object(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, TEXT)
    r = check(c.get(f"{path}/attrs"), 200)
    assert r.headers["content-type"].startswith("application/json")
    assert r.json() == {}


def test_s5_3_attrs_of_a_missing_stream_are_404(c, bucket):
    check(c.get(f"{spath(bucket, 'nope')}/attrs"), 404)
    check(c.get(f"/{unique('b')}/nope/attrs"), 404)


def test_s5_3_attrs_of_a_deleted_stream_are_404(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, TEXT, headers=attrs_header(ATTRS))
    check(c.delete(path), 204)
    check(c.get(f"{path}/attrs"), 404)


def test_s5_1_nested_metadata_round_trips(c, bucket):
    path = spath(bucket, "s")
    value = {"title": "ünïcode ✓ \"quoted\" \\ /",
             "metadata": {"n": -12, "f": 0.5, "t": True, "nil": None, "list": [1, "a", {}],
                          "deep": {"a": {"b": {"c": []}}}, "empty": {}}}
    put_attrs_target = create_stream(c, path, TEXT)
    assert put_attrs_target.status_code == 201
    put_attrs(c, path, value)
    assert get_attrs(c, path) == value


# --- §5.4 replace ------------------------------------------------------------------------

def test_s5_4_put_attrs_replaces_the_whole_object(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, TEXT, headers=attrs_header(ATTRS))
    r = put_attrs(c, path, {"metadata": {"purpose": "debugging"}})
    assert r.content == b""
    assert get_attrs(c, path) == {"metadata": {"purpose": "debugging"}}
    put_attrs(c, path, {"title": "Renamed"})
    assert get_attrs(c, path) == {"title": "Renamed"}


def test_s5_4_put_attrs_with_the_stored_value_is_204(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, TEXT, headers=attrs_header(ATTRS))
    put_attrs(c, path, ATTRS)
    assert get_attrs(c, path) == ATTRS


def test_s5_4_put_empty_object_clears_the_attrs(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, TEXT, headers=attrs_header(ATTRS))
    put_attrs(c, path, {})
    assert get_attrs(c, path) == {}
    create_stream(c, path, TEXT, status=200)


def test_s5_4_unknown_fields_are_accepted_but_not_stored(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, TEXT)
    put_attrs(c, path, {"title": "t", "color": "blue", "n": 1})
    assert get_attrs(c, path) == {"title": "t"}


def test_s5_4_create_compares_against_replaced_attrs(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, TEXT, headers=attrs_header(ATTRS))
    put_attrs(c, path, {"title": "New"})
    create_stream(c, path, TEXT, headers=attrs_header(ATTRS), status=409)
    create_stream(c, path, TEXT, headers=attrs_header({"title": "New"}), status=200)


@pytest.mark.parametrize("content_type", [None, TEXT, OCTET, "application/x-www-form-urlencoded"])
def test_s5_4_put_attrs_needs_json_content_type(c, bucket, content_type):
    path = spath(bucket, "s")
    create_stream(c, path, TEXT, headers=attrs_header(ATTRS))
    r = put_attrs(c, path, {"title": "x"}, content_type=content_type, status=400)
    if content_type is None:
        assert "content-type" not in r.request.headers
    assert get_attrs(c, path) == ATTRS


@pytest.mark.parametrize("case", list(INVALID))
def test_s5_4_put_invalid_attrs_is_400(c, bucket, case):
    path = spath(bucket, "s")
    create_stream(c, path, TEXT, headers=attrs_header(ATTRS))
    put_attrs(c, path, INVALID[case], status=400)
    assert get_attrs(c, path) == ATTRS


def test_s5_4_put_attrs_over_16_kib_is_400(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, TEXT)
    put_attrs(c, path, json.dumps(big_attrs(LIMIT + 1), separators=(",", ":")), status=400)
    assert get_attrs(c, path) == {}
    value = big_attrs(LIMIT - 64)
    put_attrs(c, path, json.dumps(value, separators=(",", ":")))
    assert get_attrs(c, path) == value


def test_s5_4_put_attrs_on_a_closed_stream_is_allowed(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, TEXT, body=b"x", headers={"Stream-Closed": "true"})
    put_attrs(c, path, {"title": "closed but renamed"})
    assert get_attrs(c, path) == {"title": "closed but renamed"}
    assert head(c, path).headers.get("stream-closed") == "true"


def test_s5_4_put_attrs_on_a_missing_stream_is_404(c, bucket):
    put_attrs(c, spath(bucket, "nope"), {"title": "x"}, status=404)
    put_attrs(c, f"/{unique('b')}/nope", {"title": "x"}, status=404)


# --- §5 attributes are not stream data ------------------------------------------------------

def observe(c, path):
    h = head(c, path)
    r = read(c, path, offset="-1")
    boot = check(c.get(f"{path}/bootstrap"), 200)
    return {
        "next": h.headers["stream-next-offset"],
        "content_type": h.headers["content-type"],
        "closed": h.headers.get("stream-closed"),
        "snapshot": (h.headers.get("stream-snapshot-offset"),
                     h.headers.get("stream-snapshot-digest")),
        "body": r.content,
        "etag": r.headers.get("etag"),
        "read_next": r.headers["stream-next-offset"],
        "bootstrap": [(p.content_type, p.body) for p in multipart(boot)],
    }


@pytest.mark.parametrize("content_type", [OCTET, JSON_CT])
def test_s5_1_attribute_changes_do_not_touch_the_stream(c, bucket, content_type):
    path = spath(bucket, "s")
    body = b'[{"a":1},{"b":2}]' if content_type == JSON_CT else b"abc"
    create_stream(c, path, content_type, body=body, headers=attrs_header({"title": "v1"}))
    append(c, path, b'{"c":3}' if content_type == JSON_CT else b"def", content_type)
    snapshot(c, path, next_offset(c, path), b"snap")
    before = observe(c, path)
    put_attrs(c, path, {"title": "v2", "metadata": {"k": "v"}})
    assert observe(c, path) == before
    put_attrs(c, path, {})
    assert observe(c, path) == before
    check(c.post(path, headers={"Stream-Closed": "true"}), 204)
    closed = observe(c, path)
    put_attrs(c, path, {"title": "after close"})
    assert observe(c, path) == closed
    assert closed["closed"] == "true"


# --- TTL: attribute and snapshot requests are reads and writes ------------------------

@pytest.mark.parametrize("request_kind", ["get-attrs", "put-attrs", "latest-snapshot"])
def test_attribute_and_snapshot_requests_renew_a_sliding_ttl(c, bucket, request_kind):
    # Each read or write resets a Stream-TTL window (base protocol). With a 2 s window, a
    # request every 0.5 s for 3.5 s keeps the stream; without renewal it expires at 2 s.
    path = spath(bucket, unique("ttl"))
    create_stream(c, path, TEXT, headers={"Stream-TTL": "2"})
    snapshot(c, path, next_offset(c, path), b"s")
    send = {
        "get-attrs": lambda: c.get(f"{path}/attrs"),
        "put-attrs": lambda: c.put(f"{path}/attrs", content=b'{"title":"t"}',
                                   headers={"Content-Type": JSON_CT}),
        "latest-snapshot": lambda: c.get(f"{path}/snapshot"),
    }[request_kind]
    deadline = time.monotonic() + 3.5
    while time.monotonic() < deadline:
        r = send()
        assert r.status_code in (200, 204, 307), r.status_code
        time.sleep(0.5)
    check(c.head(path), 200)
