"""Seed 000 §1: buckets. Bucket ids, stream ids on the bucketed surface,
create / get / list / delete, and base stream operations under a bucket."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import (JSON_CT, OCTET, TEXT, append, check, create_bucket, create_stream, head,
                     next_offset, peek, read, read_bytes, retain, snapshot, spath, unique)

LISTING_KEYS = {"bucket_id", "prefix", "stream_count", "streams", "next_cursor", "has_more"}
ENTRY_KEYS = {"stream_id", "status", "content_type", "tail_offset", "next_offset",
              "created_at_ms", "last_write_at_ms"}


def listing(c, bucket, status=200, **params):
    r = check(c.get(f"/{bucket}/streams", params=params), status)
    if status != 200:
        return r
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body = r.json()
    expected = set(LISTING_KEYS) if body.get("has_more") else LISTING_KEYS - {"next_cursor"}
    assert set(body) == expected, f"listing keys {sorted(body)}"
    assert body["bucket_id"] == bucket
    assert body["stream_count"] == len(body["streams"])
    assert isinstance(body["has_more"], bool)
    return body


def ids(body):
    return [s["stream_id"] for s in body["streams"]]


def make_streams(c, bucket, names):
    for name in names:
        create_stream(c, spath(bucket, name), TEXT)


# --- §1.1 identifiers -------------------------------------------------------

VALID_BUCKET_IDS = {
    "four_chars": lambda u: u[:4],
    "sixty_four_chars": lambda u: (u * 4)[:64],
    "dash_underscore_digits": lambda u: f"a-b_c-0123-{u[:8]}",
    "digits_only": lambda u: str(int(u[:12], 16)).rjust(12, "0"),
    "starts_with_dash": lambda u: f"-{u[:8]}",
    "starts_with_underscore": lambda u: f"_{u[:8]}",
}


@pytest.mark.parametrize("shape", list(VALID_BUCKET_IDS))
def test_s1_1_valid_bucket_ids_are_accepted(c, shape):
    bucket_id = VALID_BUCKET_IDS[shape](unique(""))
    check(c.put(f"/{bucket_id}"), 201)
    assert check(c.get(f"/{bucket_id}"), 200).json()["bucket_id"] == bucket_id
    check(c.put(f"/{bucket_id}/s", headers={"Content-Type": OCTET}), 201)


INVALID_BUCKET_IDS = ["abc", "a" * 65, "ABCD", "abCd", "ab.cd", "ab%20cd", "ab+cd", "ab~cd",
                      "%C3%A9abc", "ab%00cd", "ab:cd"]


@pytest.mark.parametrize("raw_id", INVALID_BUCKET_IDS)
def test_s1_1_invalid_bucket_id_put_is_400(c, raw_id):
    check(c.put(f"/{raw_id}"), 400)


@pytest.mark.parametrize("raw_id", ["abc", "a" * 65, "ABCD", "ab.cd"])
def test_s1_3_invalid_bucket_id_get_is_400(c, raw_id):
    check(c.get(f"/{raw_id}"), 400)


@pytest.mark.parametrize("raw_id", ["abc", "a" * 65, "ABCD", "ab.cd"])
def test_s1_5_invalid_bucket_id_delete_is_400(c, raw_id):
    check(c.delete(f"/{raw_id}"), 400)


@pytest.mark.parametrize("raw_id", ["abc", "ABCD", "ab.cd"])
def test_s1_4_invalid_bucket_id_listing_is_400(c, raw_id):
    check(c.get(f"/{raw_id}/streams"), 400)


@pytest.mark.parametrize("reserved", ["healthz", "metrics", "readyz"])
def test_s1_1_bucket_ids_of_the_servers_own_routes_are_reserved_400(c, reserved):
    # Valid by the id rule, but `/metrics` and the health checks answer at those paths.
    r = check(c.put(f"/{reserved}"), 400)
    assert "reserved" in r.text
    check(c.get(f"/{reserved}"), 200)


def test_s1_1_combined_key_of_122_bytes_is_accepted_123_rejected(c):
    bucket = create_bucket(c)
    room = 122 - len(bucket) - 1
    check(c.put(spath(bucket, "s" * room), headers={"Content-Type": OCTET}), 201)
    check(c.put(spath(bucket, "t" * (room + 1)), headers={"Content-Type": OCTET}), 400)


def test_s1_1_stream_id_limits_count_utf8_bytes_not_characters(c):
    bucket = create_bucket(c, "u" + unique("")[:3])  # 4-char bucket: 117 bytes of room
    assert len(bucket) == 4
    # "é" is 2 bytes in UTF-8: 58 of them are 116 bytes (fits), 59 are 118 (does not).
    check(c.put(spath(bucket, "é" * 58), headers={"Content-Type": OCTET}), 201)
    check(c.put(spath(bucket, "é" * 59), headers={"Content-Type": OCTET}), 400)


def test_s1_1_stream_id_over_122_bytes_is_400(c, bucket):
    check(c.put(spath(bucket, "x" * 123), headers={"Content-Type": OCTET}), 400)


@pytest.mark.parametrize("stream_id", ["a/b", "a\x00b", "a..b", "..x", "x..", "\x00"])
def test_s1_1_stream_id_with_slash_nul_or_dotdot_is_400(c, bucket, stream_id):
    # Percent-encoded, so each id reaches the server as one path segment.
    check(c.put(spath(bucket, stream_id), headers={"Content-Type": OCTET}), 400)
    check(c.get(f"/{bucket}"), 200)
    assert listing(c, bucket)["streams"] == []


def test_s1_1_stream_id_streams_is_reserved(c, bucket):
    check(c.put(f"/{bucket}/streams", headers={"Content-Type": OCTET}), 400)
    assert listing(c, bucket)["streams"] == []


@pytest.mark.parametrize("stream_id", ["a.b", "a b", "ünïcödé", "emoji-😀", "a%b", "a?b#c",
                                       "UPPER", "-", "stream", "streams2", "Streams"])
def test_s1_1_stream_id_may_be_any_other_utf8(c, bucket, stream_id):
    path = spath(bucket, stream_id)
    check(c.put(path, content=b"x", headers={"Content-Type": OCTET}), 201)
    assert read_bytes(c, path) == b"x"
    assert ids(listing(c, bucket)) == [stream_id]


# --- §1.2 create bucket -------------------------------------------------------

def test_s1_2_put_bucket_is_201(c):
    bucket = unique("b")
    check(c.put(f"/{bucket}"), 201)
    check(c.get(f"/{bucket}"), 200)


def test_s1_2_put_of_existing_bucket_is_409(c, bucket):
    check(c.put(f"/{bucket}"), 409)
    check(c.get(f"/{bucket}"), 200)


def test_s1_2_stream_put_in_missing_bucket_is_404_and_creates_no_bucket(c):
    bucket = unique("b")
    check(c.put(f"/{bucket}/s1", headers={"Content-Type": OCTET}), 404)
    check(c.get(f"/{bucket}"), 404)
    check(c.get(f"/{bucket}/streams"), 404)
    check(c.put(f"/{bucket}"), 201)
    check(c.head(f"/{bucket}/s1"), 404)


# --- §1.3 get bucket ----------------------------------------------------------

def test_s1_3_get_bucket_returns_id_and_stream_count(c, bucket):
    r = check(c.get(f"/{bucket}"), 200)
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert body["bucket_id"] == bucket
    assert body["streams"] == 0 and type(body["streams"]) is int
    make_streams(c, bucket, ["one", "two", "three"])
    assert c.get(f"/{bucket}").json()["streams"] == 3
    check(c.delete(spath(bucket, "two")), 204)
    assert c.get(f"/{bucket}").json()["streams"] == 2


def test_s1_3_get_missing_bucket_is_404(c):
    check(c.get(f"/{unique('b')}"), 404)


def test_s1_3_bucket_count_ignores_other_buckets_and_base_surface(c, bucket):
    other = create_bucket(c)
    make_streams(c, other, ["a", "b"])
    create_stream(c, f"/v1/stream/{bucket}/x", TEXT)
    assert c.get(f"/{bucket}").json()["streams"] == 0
    assert c.get(f"/{other}").json()["streams"] == 2


# --- §1.4 listing -------------------------------------------------------------

def test_s1_4_list_empty_bucket(c, bucket):
    body = listing(c, bucket)
    assert body == {"bucket_id": bucket, "prefix": "", "stream_count": 0, "streams": [],
                    "has_more": False}


def test_s1_4_list_entries_have_all_fields(c, bucket):
    before = int(time.time() * 1000)
    create_stream(c, spath(bucket, "text"), TEXT, body=b"hello")
    create_stream(c, spath(bucket, "json"), JSON_CT, body=[{"a": 1}])
    create_stream(c, spath(bucket, "empty"), OCTET)
    create_stream(c, spath(bucket, "closed"), TEXT, body=b"bye",
                  headers={"Stream-Closed": "true"})
    after = int(time.time() * 1000)
    body = listing(c, bucket)
    assert ids(body) == ["closed", "empty", "json", "text"]
    entries = {s["stream_id"]: s for s in body["streams"]}
    for name, entry in entries.items():
        assert ENTRY_KEYS <= set(entry), f"{name}: missing {ENTRY_KEYS - set(entry)}"
        for key in ("tail_offset", "created_at_ms", "last_write_at_ms"):
            assert type(entry[key]) is int, f"{name}.{key} = {entry[key]!r}"
        assert isinstance(entry["next_offset"], str)
        assert entry["next_offset"] == next_offset(c, spath(bucket, name))
        assert before - 1000 <= entry["created_at_ms"] <= after + 1000
        assert entry["created_at_ms"] <= entry["last_write_at_ms"] <= after + 1000
    assert entries["text"]["status"] == "Open"
    assert entries["closed"]["status"] == "Closed"
    assert entries["empty"]["status"] == "Open"
    assert entries["text"]["content_type"] == TEXT
    assert entries["json"]["content_type"] == JSON_CT
    assert entries["empty"]["content_type"] == OCTET
    assert entries["text"]["tail_offset"] == 5
    assert entries["closed"]["tail_offset"] == 3
    assert entries["empty"]["tail_offset"] == 0


def test_s1_4_list_tail_offset_and_last_write_follow_appends(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, OCTET)
    first = listing(c, bucket)["streams"][0]
    t0 = int(time.time() * 1000)
    append(c, path, b"0123456789")
    append(c, path, b"abc")
    t1 = int(time.time() * 1000)
    entry = listing(c, bucket)["streams"][0]
    assert entry["tail_offset"] == 13
    assert entry["next_offset"] == next_offset(c, path)
    assert entry["next_offset"] != first["next_offset"]
    assert entry["created_at_ms"] == first["created_at_ms"]
    assert t0 - 1000 <= entry["last_write_at_ms"] <= t1 + 1000
    assert entry["last_write_at_ms"] >= first["last_write_at_ms"]


def test_s1_4_list_status_follows_close(c, bucket):
    path = spath(bucket, "s")
    create_stream(c, path, TEXT)
    assert listing(c, bucket)["streams"][0]["status"] == "Open"
    check(c.post(path, headers={"Stream-Closed": "true"}), 204)
    assert listing(c, bucket)["streams"][0]["status"] == "Closed"


def test_s1_4_list_is_sorted_by_stream_id(c, bucket):
    names = ["b", "a", "c", "aa", "B", "a-", "a_", "é", "Z9", "0", "ab"]
    make_streams(c, bucket, names)
    body = listing(c, bucket)
    assert ids(body) == sorted(names, key=lambda s: s.encode())
    assert body["stream_count"] == len(names)
    assert body["has_more"] is False


def test_s1_4_list_prefix_filters_and_is_echoed(c, bucket):
    make_streams(c, bucket, ["user-1", "user-2", "user", "admin-1", "users", "usex"])
    body = listing(c, bucket, prefix="user-")
    assert body["prefix"] == "user-"
    assert ids(body) == ["user-1", "user-2"]
    assert body["stream_count"] == 2
    assert ids(listing(c, bucket, prefix="user")) == ["user", "user-1", "user-2", "users"]
    assert ids(listing(c, bucket, prefix="nobody")) == []
    assert listing(c, bucket, prefix="")["prefix"] == ""
    assert len(listing(c, bucket, prefix="")["streams"]) == 6


def test_s1_4_list_pagination_with_after_and_limit(c, bucket):
    names = [f"s{i}" for i in range(5)]
    make_streams(c, bucket, names)
    page1 = listing(c, bucket, limit=2)
    assert ids(page1) == ["s0", "s1"]
    assert page1["stream_count"] == 2
    assert page1["has_more"] is True
    assert page1["next_cursor"] == "s1"
    page2 = listing(c, bucket, limit=2, after=page1["next_cursor"])
    assert ids(page2) == ["s2", "s3"]
    assert page2["has_more"] is True and page2["next_cursor"] == "s3"
    page3 = listing(c, bucket, limit=2, after=page2["next_cursor"])
    assert ids(page3) == ["s4"]
    assert page3["stream_count"] == 1
    assert page3["has_more"] is False
    assert "next_cursor" not in page3


def test_s1_4_list_exact_page_has_no_more(c, bucket):
    make_streams(c, bucket, ["a", "b"])
    body = listing(c, bucket, limit=2)
    assert ids(body) == ["a", "b"]
    assert body["has_more"] is False
    assert "next_cursor" not in body


def test_s1_4_list_after_is_exclusive_and_need_not_exist(c, bucket):
    make_streams(c, bucket, ["a", "b", "c", "d"])
    assert ids(listing(c, bucket, after="b")) == ["c", "d"]
    assert ids(listing(c, bucket, after="bb")) == ["c", "d"]
    assert ids(listing(c, bucket, after="")) == ["a", "b", "c", "d"]
    assert ids(listing(c, bucket, after="d")) == []
    assert ids(listing(c, bucket, after="zzz")) == []


def test_s1_4_list_prefix_with_pagination(c, bucket):
    make_streams(c, bucket, ["log-a", "log-b", "log-c", "other", "log"])
    page1 = listing(c, bucket, prefix="log-", limit=2)
    assert ids(page1) == ["log-a", "log-b"]
    assert page1["prefix"] == "log-"
    assert page1["has_more"] is True and page1["next_cursor"] == "log-b"
    page2 = listing(c, bucket, prefix="log-", limit=2, after="log-b")
    assert ids(page2) == ["log-c"]
    assert page2["has_more"] is False


def test_s1_4_list_limit_bounds_are_accepted(c, bucket):
    make_streams(c, bucket, ["a", "b"])
    assert ids(listing(c, bucket, limit=1)) == ["a"]
    assert ids(listing(c, bucket, limit=1000)) == ["a", "b"]


@pytest.mark.parametrize("limit", ["0", "1001", "-1", "abc", "", "1.5", "99999999999999999999"])
def test_s1_4_list_limit_out_of_range_is_400(c, bucket, limit):
    listing(c, bucket, status=400, limit=limit)


def test_s1_4_list_limit_defaults_to_1000(c, bucket):
    names = [f"n{i:04d}" for i in range(1001)]

    def put(name):
        return c.put(spath(bucket, name), headers={"Content-Type": TEXT}).status_code

    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(put, names)) == {201}
    body = listing(c, bucket)
    assert body["stream_count"] == 1000
    assert ids(body) == names[:1000]
    assert body["has_more"] is True
    assert body["next_cursor"] == names[999]
    rest = listing(c, bucket, after=body["next_cursor"])
    assert ids(rest) == [names[1000]]
    assert rest["has_more"] is False


def test_s1_4_list_missing_bucket_is_404(c):
    check(c.get(f"/{unique('b')}/streams"), 404)


def test_s1_4_list_excludes_deleted_streams_and_other_namespaces(c, bucket):
    other = create_bucket(c)
    make_streams(c, bucket, ["keep", "gone"])
    make_streams(c, other, ["elsewhere"])
    create_stream(c, f"/v1/stream/{bucket}/base", TEXT)
    check(c.delete(spath(bucket, "gone")), 204)
    assert ids(listing(c, bucket)) == ["keep"]


# --- §1.5 delete bucket -------------------------------------------------------

def test_s1_5_delete_empty_bucket_is_204(c, bucket):
    check(c.delete(f"/{bucket}"), 204)
    check(c.get(f"/{bucket}"), 404)
    check(c.get(f"/{bucket}/streams"), 404)
    check(c.delete(f"/{bucket}"), 404)


def test_s1_5_delete_missing_bucket_is_404(c):
    check(c.delete(f"/{unique('b')}"), 404)


def test_s1_5_delete_non_empty_bucket_is_409(c, bucket):
    make_streams(c, bucket, ["a", "b"])
    check(c.delete(f"/{bucket}"), 409)
    assert c.get(f"/{bucket}").json()["streams"] == 2
    assert ids(listing(c, bucket)) == ["a", "b"]
    check(c.delete(spath(bucket, "a")), 204)
    check(c.delete(f"/{bucket}"), 409)
    check(c.delete(spath(bucket, "b")), 204)
    check(c.delete(f"/{bucket}"), 204)


def test_s1_5_deleted_bucket_takes_no_streams(c, bucket):
    check(c.delete(f"/{bucket}"), 204)
    check(c.put(spath(bucket, "s"), headers={"Content-Type": OCTET}), 404)


# --- §1.6 stream operations -----------------------------------------------------

def test_s1_6_base_operations_work_under_a_bucket(c, bucket):
    path = spath(bucket, "s")
    r = create_stream(c, path, TEXT, body=b"hello ")
    first = r.headers["stream-next-offset"]
    check(c.put(path, headers={"Content-Type": TEXT}), 200)  # idempotent create
    check(c.put(path, headers={"Content-Type": OCTET}), 409)  # config mismatch
    r = append(c, path, b"world", TEXT)
    tail = r.headers["stream-next-offset"]
    assert tail > first
    h = head(c, path)
    assert h.headers["stream-next-offset"] == tail
    assert h.headers["content-type"].startswith(TEXT)
    r = read(c, path, offset="-1")
    assert r.content == b"hello world"
    assert r.headers["stream-next-offset"] == tail
    assert r.headers.get("stream-up-to-date") == "true"
    assert read(c, path, offset=first).content == b"world"
    check(c.post(path, headers={"Stream-Closed": "true"}), 204)
    assert head(c, path).headers.get("stream-closed") == "true"
    check(c.delete(path), 204)
    check(c.head(path), 404)
    check(c.get(path), 404)


def test_s1_6_long_poll_works_under_a_bucket(c, bucket):
    path = spath(bucket, "s")
    tail = create_stream(c, path, TEXT, body=b"x").headers["stream-next-offset"]
    r = check(c.get(path, params={"offset": tail, "live": "long-poll"}), 204)
    assert r.headers["stream-next-offset"] == tail
    assert r.headers.get("stream-up-to-date") == "true"
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(c.get, path, params={"offset": tail, "live": "long-poll"})
        # Whether the read is already waiting or arrives after this append, it
        # must answer 200 with the new data (the append is well within 500 ms).
        append(c, path, b"y", TEXT)
        r = waiting.result(timeout=10)
    check(r, 200)
    assert r.content == b"y"


@pytest.mark.parametrize("method", ["GET", "HEAD", "POST", "DELETE", "PUT"])
def test_s1_6_stream_operations_in_missing_bucket_are_404(c, method):
    bucket = unique("b")
    headers = {"Content-Type": OCTET}
    body = b"x" if method in ("POST", "PUT") else None
    check(c.request(method, f"/{bucket}/s", content=body, headers=headers), 404)
    check(c.get(f"/{bucket}"), 404)


@pytest.mark.parametrize("method", ["GET", "HEAD", "POST", "DELETE"])
def test_s1_6_missing_stream_in_existing_bucket_is_404(c, bucket, method):
    body = b"x" if method == "POST" else None
    check(c.request(method, spath(bucket, "nope"), content=body,
                    headers={"Content-Type": OCTET}), 404)


def test_s1_6_long_poll_and_sse_in_missing_bucket_are_404(c):
    bucket = unique("b")
    check(c.get(f"/{bucket}/s", params={"offset": "-1", "live": "long-poll"}), 404)
    check(peek(c, f"/{bucket}/s", offset="-1", live="sse"), 404)


def test_s1_6_same_stream_id_in_two_buckets_is_two_streams(c, bucket):
    other = create_bucket(c)
    create_stream(c, spath(bucket, "s"), TEXT, body=b"one")
    create_stream(c, spath(other, "s"), OCTET, body=b"two!")
    assert read_bytes(c, spath(bucket, "s")) == b"one"
    assert read_bytes(c, spath(other, "s")) == b"two!"
    check(c.delete(spath(bucket, "s")), 204)
    assert read_bytes(c, spath(other, "s")) == b"two!"


def test_s1_6_bucketed_and_base_surfaces_are_separate_namespaces(c, bucket):
    create_stream(c, spath(bucket, "s"), TEXT, body=b"bucketed")
    check(c.head(f"/v1/stream/{bucket}/s"), 404)
    create_stream(c, f"/v1/stream/{bucket}/s", OCTET, body=b"base")
    assert read_bytes(c, spath(bucket, "s")) == b"bucketed"
    assert read_bytes(c, f"/v1/stream/{bucket}/s") == b"base"


def test_s1_6_extension_endpoints_live_on_the_bucketed_surface_only(c):
    # On the base surface a path may contain '/': ".../s/bootstrap" names
    # another (missing) stream, not an extension endpoint of ".../s".
    base = f"/v1/stream/{unique('ext')}/s"
    create_stream(c, base, OCTET, body=b"x")
    for suffix in ("bootstrap", "attrs", "snapshot"):
        check(c.get(f"{base}/{suffix}"), 404)
    assert read_bytes(c, base) == b"x"


def test_s1_6_fork_from_a_bucketed_stream(c, bucket):
    src = spath(bucket, "src")
    create_stream(c, src, TEXT, body=b"hello")
    mid = next_offset(c, src)
    append(c, src, b" world", TEXT)
    r = create_stream(c, spath(bucket, "fork"), None,
                      headers={"Stream-Forked-From": f"/{bucket}/src"})
    assert r.headers["content-type"].startswith(TEXT)
    assert read_bytes(c, spath(bucket, "fork")) == b"hello world"
    append(c, spath(bucket, "fork"), b"!", TEXT)
    assert read_bytes(c, spath(bucket, "fork")) == b"hello world!"
    assert read_bytes(c, src) == b"hello world"
    create_stream(c, spath(bucket, "early"), TEXT,
                  headers={"Stream-Forked-From": f"/{bucket}/src", "Stream-Fork-Offset": mid})
    assert read_bytes(c, spath(bucket, "early")) == b"hello"
    assert c.get(f"/{bucket}").json()["streams"] == 3


def test_s1_6_fork_source_as_an_absolute_url_must_name_this_server(c, bucket):
    create_stream(c, spath(bucket, "src"), TEXT, body=b"here")
    here = str(c.base_url).rstrip("/")
    create_stream(c, spath(bucket, "fork"), None,
                  headers={"Stream-Forked-From": f"{here}/{bucket}/src"})
    assert read_bytes(c, spath(bucket, "fork")) == b"here"
    # The same path on another host is not this stream: never fork the local one instead.
    for elsewhere in [f"http://elsewhere.example/{bucket}/src",
                      f"{here.rsplit(':', 1)[0]}:1/{bucket}/src"]:
        r = c.put(spath(bucket, "wrong"), headers={"Content-Type": TEXT,
                                                   "Stream-Forked-From": elsewhere})
        check(r, 400)
        assert "another server" in r.text
    check(c.head(spath(bucket, "wrong")), 404)


def test_s1_6_fork_across_buckets(c, bucket):
    other = create_bucket(c)
    create_stream(c, spath(bucket, "src"), OCTET, body=b"\x00\x01")
    create_stream(c, spath(other, "copy"), OCTET,
                  headers={"Stream-Forked-From": f"/{bucket}/src"})
    assert read_bytes(c, spath(other, "copy")) == b"\x00\x01"


def test_s1_6_a_retried_fork_creation_is_200_even_after_its_source_was_deleted(c, bucket):
    # Forks outlive their source; a client whose first 201 was lost retries, and must not get
    # a conflict because the source went meanwhile (base protocol: idempotent fork creation).
    src = spath(bucket, "src")
    create_stream(c, src, TEXT, body=b"hello world")
    fork_headers = {"Content-Type": TEXT, "Stream-Forked-From": f"/{bucket}/src",
                    "Stream-Fork-Offset": next_offset(c, src)}
    fork = spath(bucket, "fork")
    check(c.put(fork, headers=fork_headers), 201)
    check(c.put(fork, headers=fork_headers), 200)
    check(c.delete(src), 204)
    check(c.put(fork, headers=fork_headers), 200)
    # Another fork of the deleted source is still refused.
    check(c.put(spath(bucket, "late"), headers=fork_headers), (404, 409, 410))
    assert read_bytes(c, fork) == b"hello world"


def test_s1_6_a_retried_fork_creation_is_200_after_its_source_took_a_later_snapshot(c, bucket):
    # The source's history is trimmed to its snapshot, so a new fork must start at or after it;
    # a fork made before the snapshot moved on is still the fork a retry asked for.
    src = spath(bucket, "src")
    create_stream(c, src, TEXT, body=b"a")
    offsets = []
    for _ in range(10):
        offsets.append(next_offset(c, src))
        append(c, src, b"b", TEXT)
    snapshot(c, src, offsets[3], b"three", TEXT)
    retain(c, src, offsets[3])
    fork_headers = {"Content-Type": TEXT, "Stream-Forked-From": f"/{bucket}/src",
                    "Stream-Fork-Offset": offsets[5]}
    fork = spath(bucket, "fork")
    check(c.put(fork, headers=fork_headers), 201)
    snapshot(c, src, offsets[7], b"seven", TEXT)
    check(c.put(fork, headers=fork_headers), 200)
    # As for any repeated creation, what the request gives must match the fork.
    check(c.put(fork, headers={**fork_headers, "Content-Type": OCTET}), 409)
    check(c.put(fork, headers={**fork_headers, "Stream-TTL": "60"}), 409)
    # A new fork there is refused: the records before the snapshot are gone from the source.
    check(c.put(spath(bucket, "late"), headers=fork_headers), 409)


def test_s1_6_fork_from_missing_source_is_404(c, bucket):
    check(c.put(spath(bucket, "fork"), headers={"Content-Type": OCTET,
                                                "Stream-Forked-From": f"/{bucket}/nope"}), 404)
    check(c.put(spath(bucket, "fork2"), headers={
        "Content-Type": OCTET, "Stream-Forked-From": f"/{unique('b')}/nope"}), 404)
    check(c.head(spath(bucket, "fork")), 404)


@pytest.mark.parametrize("route,method,allowed", [
    ("bootstrap", "DELETE", "GET, OPTIONS"),
    ("append-batch", "GET", "POST, OPTIONS"),
    ("attrs", "POST", "GET, PUT, OPTIONS"),
    ("retention", "GET", "PUT, OPTIONS"),
    ("snapshot", "DELETE", "GET, HEAD, PUT, OPTIONS"),
    ("snapshot/0000000000000000_0000000000000000", "POST", "GET, HEAD, PUT, DELETE, OPTIONS"),
])
def test_s1_extension_routes_answer_other_methods_with_405_and_their_own_allow(
        c, bucket, route, method, allowed):
    create_stream(c, spath(bucket, "s"), TEXT, body=b"x")
    r = c.request(method, f"{spath(bucket, 's')}/{route}")
    check(r, 405)
    assert r.headers["allow"] == allowed
    assert allowed in r.text


@pytest.mark.parametrize("route", ["attrs", "append-batch", "snapshot", "snapshot/0000000000000000_0000000000000000",
                                   "retention", "bootstrap", "streamld"])
def test_s1_extension_routes_answer_cors_preflights(c, bucket, route):
    create_stream(c, spath(bucket, "s"), TEXT, body=b"x")
    r = c.options(f"{spath(bucket, 's')}/{route}", headers={
        "Origin": "https://app.example", "Access-Control-Request-Method": "PUT"})
    assert r.status_code in (200, 204), r.text
    assert "PUT" in r.headers["access-control-allow-methods"]
