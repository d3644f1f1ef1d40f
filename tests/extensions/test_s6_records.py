"""Seed 000 §6: JSON record coordinates (token advertisement, acknowledgements,
Stream-Record-Match, HEAD, record-aware reads, NDJSON and envelope views,
long-poll and SSE, retention / snapshot boundaries). The §6.13 invariants are
in test_s6_13_invariants.py."""

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import (ENVELOPE_NDJSON, ENVELOPE_SSE, JSON_CT, NDJSON, OCTET, RECORDS_TOKEN, SSE,
                     START, TEXT, append, check, controls, create_stream, data_events, describe,
                     extension_tokens, forge_offset, head, int_header, ndjson, next_offset, peek,
                     read, record_headers, retain, snapshot, spath, unique)

VALUES = [{"type": "navigation_started", "n": 0}, {"type": "network_response", "status": 500},
          "text", 42, [1, 2], None, {"nested": {"deep": [True, False]}}]


@pytest.fixture(params=["bucketed", "base"])
def surface(request, c):
    """A function that makes a fresh stream path on one of the two surfaces."""
    if request.param == "bucketed":
        bucket = unique("b")
        check(c.put(f"/{bucket}"), 201)
        return lambda name="s": spath(bucket, name)
    prefix = unique("rec")
    return lambda name="s": f"/v1/stream/{prefix}/{name}"


def jstream(c, path, initial=None, status=201):
    return create_stream(c, path, JSON_CT, body=initial, status=status)


def filled(c, bucket, values=VALUES, name="j"):
    """A JSON stream holding `values`, one POST each (so O(r) is known);
    returns (path, offsets) with offsets[r] = O(r), offsets[-1] = the tail."""
    path = spath(bucket, name)
    jstream(c, path)
    offsets = [START]
    for v in values:
        offsets.append(append(c, path, json.dumps(v), JSON_CT).headers["stream-next-offset"])
    return path, offsets


def rec_read(c, path, status=200, content_type=NDJSON, **params):
    """A record-aware read; on 200 checks the token and the record headers."""
    r = check(c.get(path, params=params), status)
    if status == 200:
        assert RECORDS_TOKEN in extension_tokens(r), describe(r)
        assert r.headers["content-type"].split(";")[0].strip() == content_type, describe(r)
        for name in ("stream-record-first", "stream-record-start", "stream-record-next",
                     "stream-next-offset"):
            assert name in r.headers, f"missing {name}\n{describe(r)}"
    return r


def acked_range(r):
    assert RECORDS_TOKEN in extension_tokens(r), describe(r)
    return int_header(r, "stream-record-start"), int_header(r, "stream-record-next")


def first_next(c, path):
    h = head(c, path)
    return int_header(h, "stream-record-first"), int_header(h, "stream-record-next")


# --- Extension capability advertisement -----------------------------------------------

def test_s6_token_is_advertised_on_json_stream_responses(c, surface):
    path = surface()
    assert RECORDS_TOKEN in extension_tokens(jstream(c, path, [1]))
    assert RECORDS_TOKEN in extension_tokens(jstream(c, path, status=200))
    assert RECORDS_TOKEN in extension_tokens(append(c, path, "2", JSON_CT))
    assert RECORDS_TOKEN in extension_tokens(read(c, path, offset="-1"))
    assert RECORDS_TOKEN in extension_tokens(head(c, path))
    assert RECORDS_TOKEN in extension_tokens(rec_read(c, path, record="0"))


@pytest.mark.parametrize("content_type", [TEXT, OCTET, "application/x-ndjson",
                                          "application/ndjson", "text/json",
                                          "application/vnd.api+json"])
def test_s6_token_is_never_advertised_on_other_content_types(c, surface, content_type):
    path = surface()
    responses = [create_stream(c, path, content_type, body=b'{"a":1}'),
                 append(c, path, b'{"b":2}', content_type),
                 read(c, path, offset="-1"),
                 head(c, path)]
    for r in responses:
        assert RECORDS_TOKEN not in extension_tokens(r), describe(r)


# --- §6.1 / §6.3 acknowledgements --------------------------------------------------------

def test_s6_3_put_with_initial_array_acks_the_record_range(c, surface):
    path = surface()
    r = jstream(c, path, [{"a": 1}, {"b": 2}, {"c": 3}])
    assert acked_range(r) == (0, 3)
    assert first_next(c, path) == (0, 3)


def test_s6_3_put_with_a_single_value_is_one_record(c, surface):
    path = surface()
    assert acked_range(jstream(c, path, {"only": True})) == (0, 1)


@pytest.mark.parametrize("initial", [None, "[]"], ids=["no-body", "empty-array"])
def test_s6_3_put_creating_no_records_acks_the_tail(c, surface, initial):
    path = surface()
    assert acked_range(jstream(c, path, initial)) == (0, 0)
    assert first_next(c, path) == (0, 0)


def test_s6_3_post_acks_contiguous_ranges(c, surface):
    path = surface()
    jstream(c, path, [0, 1, 2])
    assert acked_range(append(c, path, '{"x":1}', JSON_CT)) == (3, 4)
    assert acked_range(append(c, path, '[{"type":"a"},{"type":"b"}]', JSON_CT)) == (4, 6)
    assert acked_range(append(c, path, "[[1,2],[3]]", JSON_CT)) == (6, 8)
    assert acked_range(append(c, path, "[[[1,2,3]]]", JSON_CT)) == (8, 9)
    assert first_next(c, path) == (0, 9)
    assert read(c, path).json() == [0, 1, 2, {"x": 1}, {"type": "a"}, {"type": "b"},
                                    [1, 2], [3], [[1, 2, 3]]]


@pytest.mark.parametrize("body", ["[]", "{not json", '{"a":1} {"b":2}', ""],
                         ids=["empty-array", "invalid", "two-values", "empty-body"])
def test_s6_3_failed_appends_take_no_ordinal(c, surface, body):
    path = surface()
    jstream(c, path, [1, 2])
    check(c.post(path, content=body, headers={"Content-Type": JSON_CT}), 400)
    assert first_next(c, path) == (0, 2)
    assert acked_range(append(c, path, "3", JSON_CT)) == (2, 3)


def producer_post(c, path, seq, body):
    h = {"Content-Type": JSON_CT, "Producer-Id": "writer-1", "Producer-Epoch": "0",
         "Producer-Seq": str(seq)}
    return check(c.post(path, content=body, headers=h), (200, 204))


def test_s6_3_deduplicated_retry_returns_the_original_range(c, surface):
    path = surface()
    jstream(c, path, ["x"])
    assert acked_range(producer_post(c, path, 0, '[{"a":1},{"a":2}]')) == (1, 3)
    retry = producer_post(c, path, 0, '[{"a":1},{"a":2}]')
    assert retry.status_code == 204
    assert acked_range(retry) == (1, 3)
    assert acked_range(producer_post(c, path, 1, '{"a":3}')) == (3, 4)
    retry = producer_post(c, path, 1, '{"a":3}')
    assert retry.status_code == 204
    assert acked_range(retry) == (3, 4)
    assert first_next(c, path) == (0, 4)
    assert read(c, path).json() == ["x", {"a": 1}, {"a": 2}, {"a": 3}]


def test_s6_3_deduplicated_retry_of_an_older_request_returns_its_range(c, surface):
    path = surface()
    jstream(c, path)
    assert acked_range(producer_post(c, path, 0, "[1,2]")) == (0, 2)
    assert acked_range(producer_post(c, path, 1, "3")) == (2, 3)
    retry = producer_post(c, path, 0, "[1,2]")
    assert retry.status_code == 204
    assert acked_range(retry) == (0, 2)
    assert first_next(c, path) == (0, 3)


def test_s6_3_deduplicated_retry_older_than_the_remembered_appends_reports_no_range(c, surface):
    # Runnel remembers each producer's last 16 appends. An older retry is still deduplicated,
    # but its range is forgotten: no range is better than a wrong one.
    path = surface()
    jstream(c, path)
    for seq in range(20):
        assert acked_range(producer_post(c, path, seq, str(seq))) == (seq, seq + 1)
    retry = producer_post(c, path, 0, "0")
    assert retry.status_code == 204
    assert "stream-record-start" not in retry.headers
    assert "stream-record-next" not in retry.headers
    assert acked_range(producer_post(c, path, 10, "10")) == (10, 11)
    assert first_next(c, path) == (0, 20)


def test_s6_3_concurrent_appenders_get_disjoint_ranges_in_commit_order(c, bucket):
    path = spath(bucket, "j")
    jstream(c, path)
    writers, per_writer = 6, 8
    results = []
    lock = threading.Lock()

    def write(w):
        for i in range(per_writer):
            values = [{"w": w, "i": i, "k": k} for k in range(1 + (w + i) % 3)]
            r = append(c, path, json.dumps(values), JSON_CT)
            with lock:
                results.append((acked_range(r), values))

    with ThreadPoolExecutor(writers) as pool:
        list(pool.map(write, range(writers)))
    results.sort(key=lambda item: item[0][0])
    cursor = 0
    for (start, nxt), values in results:
        assert start == cursor, f"gap or overlap at {cursor}: {start}"
        assert nxt - start == len(values)
        cursor = nxt
    records = ndjson(rec_read(c, path, record="0"))
    assert len(records) == cursor
    for (start, nxt), values in results:
        assert records[start:nxt] == values


# --- §6.4 Stream-Record-Match ------------------------------------------------------------

def test_s6_4_record_match_accepts_the_current_tail(c, surface):
    path = surface()
    jstream(c, path, [1, 2])
    r = append(c, path, "[3,4]", JSON_CT, headers={"Stream-Record-Match": "2"})
    assert acked_range(r) == (2, 4)
    r = append(c, path, "5", JSON_CT, headers={"Stream-Record-Match": "4"})
    assert acked_range(r) == (4, 5)


@pytest.mark.parametrize("expected", ["0", "1", "3", "1000"])
def test_s6_4_record_match_mismatch_is_412_with_tail_headers(c, surface, expected):
    path = surface()
    jstream(c, path, [1, 2])
    tail = next_offset(c, path)
    r = check(c.post(path, content="3", headers={"Content-Type": JSON_CT,
                                                 "Stream-Record-Match": expected}), 412)
    assert int_header(r, "stream-record-next") == 2
    assert RECORDS_TOKEN in extension_tokens(r), "record headers come with the token"
    assert r.headers["stream-next-offset"] == tail
    assert first_next(c, path) == (0, 2)
    assert read(c, path).json() == [1, 2]


def test_s6_4_record_match_on_an_empty_stream(c, surface):
    path = surface()
    jstream(c, path)
    check(c.post(path, content="1", headers={"Content-Type": JSON_CT,
                                             "Stream-Record-Match": "1"}), 412)
    r = append(c, path, "1", JSON_CT, headers={"Stream-Record-Match": "0"})
    assert acked_range(r) == (0, 1)


def test_s6_4_record_match_composes_with_stream_seq(c, surface):
    path = surface()
    jstream(c, path)
    append(c, path, "1", JSON_CT, headers={"Stream-Seq": "0001", "Stream-Record-Match": "0"})
    # Record tail matches, Stream-Seq regresses: the Stream-Seq rule still applies.
    check(c.post(path, content="2", headers={"Content-Type": JSON_CT, "Stream-Seq": "0001",
                                             "Stream-Record-Match": "1"}), 409)
    # Stream-Seq advances, record tail does not match.
    check(c.post(path, content="2", headers={"Content-Type": JSON_CT, "Stream-Seq": "0002",
                                             "Stream-Record-Match": "0"}), 412)
    r = append(c, path, "2", JSON_CT, headers={"Stream-Seq": "0002", "Stream-Record-Match": "1"})
    assert acked_range(r) == (1, 2)
    assert read(c, path).json() == [1, 2]


# --- §6.5 HEAD ---------------------------------------------------------------------------

def test_s6_5_head_reports_first_and_next(c, surface):
    path = surface()
    jstream(c, path)
    assert first_next(c, path) == (0, 0)
    append(c, path, "[1,2,3]", JSON_CT)
    assert first_next(c, path) == (0, 3)
    append(c, path, "4", JSON_CT)
    h = head(c, path)
    assert (int_header(h, "stream-record-first"), int_header(h, "stream-record-next")) == (0, 4)
    assert RECORDS_TOKEN in extension_tokens(h)


def test_s6_5_head_first_follows_retention(c, bucket):
    path, o = filled(c, bucket, [1, 2, 3, 4])
    snapshot(c, path, o[3], b"s")
    retain(c, path, o[2])
    assert first_next(c, path) == (2, 4)


# --- §6.6 read parameters ------------------------------------------------------------------

def test_s6_6_record_read_starts_at_the_ordinal(c, surface):
    path = surface()
    jstream(c, path, VALUES)
    tail = next_offset(c, path)
    for r_ in range(len(VALUES)):
        r = rec_read(c, path, record=str(r_))
        assert ndjson(r) == VALUES[r_:]
        assert record_headers(r) == (0, r_, len(VALUES))
        assert r.headers["stream-next-offset"] == tail


def test_s6_6_record_equal_to_tail_is_an_empty_up_to_date_read(c, surface):
    path = surface()
    jstream(c, path, [1, 2])
    r = rec_read(c, path, record="2")
    assert r.content == b""
    assert record_headers(r) == (0, 2, 2)
    assert r.headers["stream-next-offset"] == next_offset(c, path)
    assert r.headers.get("stream-up-to-date") == "true"


def test_s6_6_record_now_reads_from_the_tail(c, surface):
    path = surface()
    jstream(c, path, [1, 2, 3])
    r = rec_read(c, path, record="now")
    assert r.content == b""
    assert record_headers(r) == (0, 3, 3)
    assert r.headers["stream-next-offset"] == next_offset(c, path)
    empty = surface("empty")
    jstream(c, empty)
    assert record_headers(rec_read(c, empty, record="now")) == (0, 0, 0)


@pytest.mark.parametrize("beyond", [4, 5, 1000])
def test_s6_6_record_above_tail_is_400_with_record_next(c, surface, beyond):
    path = surface()
    jstream(c, path, [1, 2, 3])
    r = check(c.get(path, params={"record": str(beyond)}), 400)
    assert int_header(r, "stream-record-next") == 3
    assert RECORDS_TOKEN in extension_tokens(r), "record headers come with the token"


def test_s6_6_record_below_first_is_410_with_headers(c, bucket):
    path, o = filled(c, bucket, [1, 2, 3, 4, 5])
    snapshot(c, path, o[3], b"s")
    retain(c, path, o[3])
    for gone in ("0", "2"):
        r = check(c.get(path, params={"record": gone}), 410)
        assert int_header(r, "stream-record-first") == 3
        assert int_header(r, "stream-record-next") == 5
        assert RECORDS_TOKEN in extension_tokens(r), "record headers come with the token"
    assert ndjson(rec_read(c, path, record="3")) == [4, 5]


def test_s6_6_tail_records_starts_at_max_of_first_and_next_minus_count(c, bucket):
    path, o = filled(c, bucket, list(range(6)))
    r = rec_read(c, path, tail_records="2")
    assert ndjson(r) == [4, 5]
    assert record_headers(r) == (0, 4, 6)
    assert ndjson(rec_read(c, path, tail_records="6")) == list(range(6))
    assert ndjson(rec_read(c, path, tail_records="100")) == list(range(6))
    snapshot(c, path, o[4], b"s")
    retain(c, path, o[4])
    r = rec_read(c, path, tail_records="100")
    assert ndjson(r) == [4, 5]
    assert record_headers(r) == (4, 4, 6)
    assert ndjson(rec_read(c, path, tail_records="1")) == [5]


def test_s6_6_tail_records_zero_is_record_now(c, surface):
    path = surface()
    jstream(c, path, [1, 2])
    r = rec_read(c, path, tail_records="0")
    assert r.content == b""
    assert record_headers(r) == (0, 2, 2)
    assert r.headers["stream-next-offset"] == next_offset(c, path)


@pytest.mark.parametrize("value", ["-1", "abc", "1.0", "", "+1", "0x1", "1e2", "NOW"])
def test_s6_6_malformed_record_is_400(c, surface, value):
    path = surface()
    jstream(c, path, [1, 2])
    check(c.get(path, params={"record": value}), 400)


@pytest.mark.parametrize("value", ["-1", "abc", "1.5", "", "+2", "now"])
def test_s6_6_tail_records_must_be_a_non_negative_integer(c, surface, value):
    path = surface()
    jstream(c, path, [1, 2])
    check(c.get(path, params={"tail_records": value}), 400)


@pytest.mark.parametrize("params", [
    {"record": "0", "tail_records": "1"},
    {"record": "0", "offset": "-1"},
    {"record": "now", "offset": "-1"},
    {"tail_records": "1", "offset": "-1"},
    {"record": "now", "tail_records": "0"},
    {"record": "0", "offset": START},
], ids=["record+tail", "record+offset", "now+offset", "tail+offset", "now+tail",
        "record+token"])
def test_s6_6_start_parameters_are_mutually_exclusive(c, surface, params):
    path = surface()
    jstream(c, path, [1, 2])
    check(c.get(path, params=params), 400)


def test_s6_6_max_records_limits_the_read(c, bucket):
    path, o = filled(c, bucket, list(range(5)))
    r = rec_read(c, path, record="0", max_records="2")
    assert ndjson(r) == [0, 1]
    assert record_headers(r) == (0, 0, 2)
    assert r.headers["stream-next-offset"] == o[2]
    r = rec_read(c, path, record="2", max_records="2")
    assert ndjson(r) == [2, 3]
    assert r.headers["stream-next-offset"] == o[4]
    r = rec_read(c, path, record="4", max_records="2")
    assert ndjson(r) == [4]
    assert record_headers(r) == (0, 4, 5)
    assert r.headers["stream-next-offset"] == o[5]
    assert r.headers.get("stream-up-to-date") == "true"
    assert ndjson(rec_read(c, path, tail_records="3", max_records="1")) == [2]
    assert ndjson(rec_read(c, path, record="now", max_records="1")) == []


def test_s6_6_max_records_never_splits_a_multi_record_append(c, bucket):
    path = spath(bucket, "j")
    jstream(c, path, [1, 2, 3, 4, 5])  # one append unit, five records
    r = rec_read(c, path, record="1", max_records="2")
    assert ndjson(r) == [2, 3]
    assert record_headers(r) == (0, 1, 3)
    rest = read(c, path, offset=r.headers["stream-next-offset"])
    assert rest.json() == [4, 5]


@pytest.mark.parametrize("params", [{"max_records": "1"},
                                    {"max_records": "1", "offset": "-1"},
                                    {"max_records": "1", "offset": START}],
                         ids=["alone", "offset-minus-one", "offset-token"])
def test_s6_6_max_records_without_a_record_start_is_400(c, surface, params):
    path = surface()
    jstream(c, path, [1, 2])
    check(c.get(path, params=params), 400)


@pytest.mark.parametrize("value", ["0", "-1", "abc", "", "1.5"])
def test_s6_6_max_records_must_be_a_positive_integer(c, surface, value):
    path = surface()
    jstream(c, path, [1, 2])
    check(c.get(path, params={"record": "0", "max_records": value}), 400)


@pytest.mark.parametrize("params", [{"record": "0", "max_bytes": "10"},
                                    {"tail_records": "1", "max_bytes": "10"},
                                    {"record": "now", "max_bytes": "10"},
                                    {"record": "0", "max_records": "1", "max_bytes": "10"}],
                         ids=["record", "tail_records", "now", "with-max-records"])
def test_s6_6_max_bytes_in_a_record_read_is_400(c, surface, params):
    path = surface()
    jstream(c, path, [1, 2])
    check(c.get(path, params=params), 400)


@pytest.mark.parametrize("params", [{"record": "0"}, {"record": "now"}, {"tail_records": "1"},
                                    {"record": "0", "max_records": "1"},
                                    {"record": "0", "record_view": "envelope"},
                                    {"record": "0", "live": "long-poll"},
                                    {"record": "0", "live": "sse"}],
                         ids=["record", "now", "tail", "max", "envelope", "long-poll", "sse"])
@pytest.mark.parametrize("content_type", [TEXT, OCTET])
def test_s6_6_record_parameters_on_a_non_json_stream_are_400(c, surface, content_type, params):
    path = surface()
    create_stream(c, path, content_type, body=b"abc")
    check(peek(c, path, **params), 400)


def test_s6_6_record_read_of_a_missing_stream_is_404(c, surface):
    check(c.get(surface("nope"), params={"record": "0"}), 404)


# --- §6.7 record-aligned responses -----------------------------------------------------------

def test_s6_7_record_read_is_ndjson_of_normalised_values(c, surface):
    path = surface()
    jstream(c, path)
    append(c, path, '{ "b" : [1 , 2] ,\n  "a" : "line\\nbreak" }', JSON_CT)
    append(c, path, '[ "x" ,\r\n {"k":\t{"z":null}} ]', JSON_CT)
    append(c, path, '  "\\u00e9t\\u00e9"  ', JSON_CT)
    r = rec_read(c, path, record="0")
    assert ndjson(r) == [{"b": [1, 2], "a": "line\nbreak"}, "x", {"k": {"z": None}}, "été"]
    assert r.content.count(b"\n") == 4


def test_s6_7_offsets_and_records_name_the_same_boundaries(c, surface):
    path = surface()
    jstream(c, path, VALUES[:3])
    append(c, path, json.dumps(VALUES[3:]), JSON_CT)
    n = len(VALUES)
    boundary = {0: START}
    for k in range(1, n + 1):
        r = rec_read(c, path, record="0", max_records=str(k))
        assert record_headers(r)[2] == k
        boundary[k] = r.headers["stream-next-offset"]
    assert boundary[n] == next_offset(c, path)
    for k in range(n):
        r = rec_read(c, path, record=str(k), max_records="1")
        assert ndjson(r) == [VALUES[k]]
        assert r.headers["stream-next-offset"] == boundary[k + 1]
        assert read(c, path, offset=boundary[k]).json() == VALUES[k:]


def test_s6_7_offset_reads_are_unchanged(c, surface):
    path = surface()
    jstream(c, path, [{"a": 1}, {"b": 2}])
    r = read(c, path, offset="-1")
    assert r.headers["content-type"].startswith(JSON_CT)
    assert r.json() == [{"a": 1}, {"b": 2}]
    assert read(c, path, offset="now").json() == []


def test_s6_7_long_poll_with_record_start_waits_for_new_records(c, surface):
    path = surface()
    jstream(c, path, [1, 2])
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(c.get, path, params={"record": "2", "live": "long-poll"})
        append(c, path, "[3,4]", JSON_CT)
        r = waiting.result(timeout=10)
    check(r, 200)
    assert RECORDS_TOKEN in extension_tokens(r)
    assert r.headers["content-type"].startswith(NDJSON)
    assert ndjson(r) == [3, 4]
    assert record_headers(r) == (0, 2, 4)
    assert r.headers["stream-next-offset"] == next_offset(c, path)


def test_s6_7_long_poll_with_record_now_times_out_then_sees_new_records(c, surface):
    path = surface()
    jstream(c, path, [1])
    r = check(c.get(path, params={"record": "now", "live": "long-poll"}), 204)
    assert r.headers["stream-next-offset"] == next_offset(c, path)
    assert r.headers.get("stream-up-to-date") == "true"
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(c.get, path, params={"record": "1", "live": "long-poll",
                                                   "max_records": "1"})
        append(c, path, "[2,3]", JSON_CT)
        r = waiting.result(timeout=10)
    check(r, 200)
    assert ndjson(r) == [2]
    assert record_headers(r) == (0, 1, 2)


def test_s6_7_long_poll_with_existing_records_answers_at_once(c, surface):
    path = surface()
    jstream(c, path, [1, 2, 3])
    r = check(c.get(path, params={"tail_records": "2", "live": "long-poll"}), 200)
    assert ndjson(r) == [2, 3]
    assert record_headers(r) == (0, 1, 3)


def test_s6_7_long_poll_below_first_is_410(c, bucket):
    path, o = filled(c, bucket, [1, 2, 3])
    snapshot(c, path, o[2], b"s")
    retain(c, path, o[2])
    r = check(c.get(path, params={"record": "1", "live": "long-poll"}), 410)
    assert int_header(r, "stream-record-first") == 2


# --- §6.8 envelope view ---------------------------------------------------------------------

def test_s6_8_envelope_view_wraps_each_record(c, surface):
    path = surface()
    jstream(c, path, VALUES)
    r = rec_read(c, path, content_type=ENVELOPE_NDJSON, record="2", record_view="envelope")
    lines = ndjson(r)
    assert lines == [{"record": 2 + i, "value": v} for i, v in enumerate(VALUES[2:])]
    assert record_headers(r) == (0, 2, len(VALUES))


def test_s6_8_envelope_with_tail_records_and_max_records(c, surface):
    path = surface()
    jstream(c, path, list("abcdef"))
    r = rec_read(c, path, content_type=ENVELOPE_NDJSON, tail_records="3", max_records="2",
                 record_view="envelope")
    assert ndjson(r) == [{"record": 3, "value": "d"}, {"record": 4, "value": "e"}]
    r = rec_read(c, path, content_type=ENVELOPE_NDJSON, record="now", record_view="envelope")
    assert r.content == b""


def test_s6_8_envelope_after_retention_keeps_ordinals(c, bucket):
    path, o = filled(c, bucket, list("abcde"))
    snapshot(c, path, o[3], b"s")
    retain(c, path, o[2])
    r = rec_read(c, path, content_type=ENVELOPE_NDJSON, tail_records="99",
                 record_view="envelope")
    assert ndjson(r) == [{"record": 2, "value": "c"}, {"record": 3, "value": "d"},
                         {"record": 4, "value": "e"}]


@pytest.mark.parametrize("params", [{"record_view": "envelope"},
                                    {"record_view": "envelope", "offset": "-1"},
                                    {"record_view": "envelope", "offset": START}],
                         ids=["alone", "offset-minus-one", "offset-token"])
def test_s6_8_envelope_needs_a_record_start(c, surface, params):
    path = surface()
    jstream(c, path, [1])
    check(c.get(path, params=params), 400)


def test_s6_8_envelope_changes_nothing_canonical(c, surface):
    path = surface()
    jstream(c, path, [{"a": 1}, {"b": 2}])
    before = read(c, path, offset="-1")
    rec_read(c, path, content_type=ENVELOPE_NDJSON, record="0", record_view="envelope")
    after = read(c, path, offset="-1")
    assert after.content == before.content
    assert after.headers.get("etag") == before.headers.get("etag")
    assert after.headers["stream-next-offset"] == before.headers["stream-next-offset"]
    assert first_next(c, path) == (0, 2)


# --- §6.9 SSE ---------------------------------------------------------------------------------

# Test data for JSON-mode SSE holds no top-level arrays: §6.9 lets a data event
# be the base protocol's JSON array or newline-delimited messages, and without
# array-valued records the two forms cannot be confused.
SSE_VALUES = [v for v in VALUES if not isinstance(v, list)]


def event_messages(e):
    """The messages of one JSON-mode SSE data event, in either form."""
    try:
        whole = json.loads(e.data)
    except ValueError:
        whole = None
    if isinstance(whole, list):
        return whole
    return [json.loads(line) for line in e.data.split("\n") if line.strip()]


def sse_values(events):
    return [m for e in data_events(events) for m in event_messages(e)]


def check_record_controls(events, first, start):
    """Each control event names the boundary after everything sent before it."""
    seen = start
    for e in events:
        if e.type == "data":
            seen += len(event_messages(e))
        elif e.type == "control":
            ctl = e.json()
            assert isinstance(ctl["streamNextOffset"], str)
            assert ctl["streamFirstRecord"] == first, ctl
            assert ctl["streamNextRecord"] == seen, ctl


def test_s6_9_sse_with_a_record_start_adds_record_coordinates(c, surface):
    path = surface()
    jstream(c, path, SSE_VALUES)
    with SSE(c, path, record="3", live="sse") as s:
        check(s.response, 200)
        assert RECORDS_TOKEN in extension_tokens(s.response)
        assert s.response.headers["content-type"].startswith("text/event-stream")
        events = s.until_up_to_date()
        assert sse_values(events) == SSE_VALUES[3:]
        check_record_controls(events, 0, 3)
        last = controls(events)[-1]
        assert last["streamNextRecord"] == len(SSE_VALUES)
        assert last["streamNextOffset"] == next_offset(c, path)
        append(c, path, '[{"late":1},{"late":2}]', JSON_CT)
        more = s.until(lambda e: e.type == "control"
                       and e.json()["streamNextRecord"] == len(SSE_VALUES) + 2)
        assert sse_values(more) == [{"late": 1}, {"late": 2}]
        check_record_controls(more, 0, len(SSE_VALUES))


def test_s6_9_sse_record_now_sends_only_new_records(c, surface):
    path = surface()
    jstream(c, path, [1, 2])
    with SSE(c, path, record="now", live="sse") as s:
        check(s.response, 200)
        first = s.until(lambda e: e.type == "control")
        assert sse_values(first) == []
        assert controls(first)[0]["streamNextRecord"] == 2
        append(c, path, "3", JSON_CT)
        more = s.until(lambda e: e.type == "control" and e.json()["streamNextRecord"] == 3)
        assert sse_values(more) == [3]


def test_s6_9_sse_tail_records(c, surface):
    path = surface()
    jstream(c, path, list(range(5)))
    with SSE(c, path, tail_records="2", live="sse") as s:
        events = s.until_up_to_date()
    assert sse_values(events) == [3, 4]
    check_record_controls(events, 0, 3)


def test_s6_9_sse_reconnect_from_stream_next_record(c, surface):
    path = surface()
    jstream(c, path, [1, 2])
    with SSE(c, path, record="0", live="sse") as s:
        resume = controls(s.until_up_to_date())[-1]
    append(c, path, "[3,4]", JSON_CT)
    with SSE(c, path, record=str(resume["streamNextRecord"]), live="sse") as s:
        events = s.until_up_to_date()
    assert sse_values(events) == [3, 4]
    with SSE(c, path, offset=resume["streamNextOffset"], live="sse") as s:
        events = s.until_up_to_date()
    assert sse_values(events) == [3, 4]


def test_s6_9_sse_envelope_sends_one_envelope_per_event(c, surface):
    path = surface()
    jstream(c, path, VALUES[:4])
    with SSE(c, path, record="1", record_view="envelope", live="sse") as s:
        check(s.response, 200)
        assert s.response.headers.get("stream-data-content-type") == ENVELOPE_SSE
        assert RECORDS_TOKEN in extension_tokens(s.response)
        events = s.until_up_to_date()
        envelopes = [e.json() for e in data_events(events)]
        assert envelopes == [{"record": i, "value": VALUES[i]} for i in range(1, 4)]
        seen = 1
        for e in events:
            if e.type == "data":
                seen += 1
            elif e.type == "control":
                assert e.json()["streamNextRecord"] == seen
                assert e.json()["streamFirstRecord"] == 0
        append(c, path, '["x","y"]', JSON_CT)
        more = s.until(lambda e: e.type == "control" and e.json()["streamNextRecord"] == 6)
        assert [e.json() for e in data_events(more)] == [{"record": 4, "value": "x"},
                                                         {"record": 5, "value": "y"}]


def test_s6_9_sse_below_first_is_410(c, bucket):
    path, o = filled(c, bucket, [1, 2, 3])
    snapshot(c, path, o[2], b"s")
    retain(c, path, o[2])
    r = check(peek(c, path, record="0", live="sse"), 410)
    assert int_header(r, "stream-record-first") == 2
    with SSE(c, path, record="2", live="sse") as s:
        events = s.until_up_to_date()
    assert sse_values(events) == [3]
    check_record_controls(events, 2, 2)


# --- §6.10 retention, snapshots, bootstrap ------------------------------------------------------

def test_s6_10_snapshot_at_an_intra_record_offset_is_400(c, bucket):
    path = spath(bucket, "j")
    jstream(c, path, [{"long": "x" * 40}, {"long": "y" * 40}])
    inside = [forge_offset(0, 5), forge_offset(0, 1), forge_offset(1, 60)]
    for off in inside:
        check(c.put(f"{path}/snapshot/{off}", content=b"s"), 400)
    check(c.get(f"{path}/snapshot"), 404)
    snapshot(c, path, next_offset(c, path), b"all")
    for off in inside:
        check(c.put(f"{path}/snapshot/{off}", content=b"s"), 400)
        check(c.put(f"{path}/retention/{off}"), 400)
    assert first_next(c, path) == (0, 2)


def test_s6_10_snapshot_at_a_record_boundary_inside_one_append_is_accepted(c, bucket):
    path = spath(bucket, "j")
    jstream(c, path, [{"a": 1}, {"b": 2}, {"c": 3}])
    o1 = rec_read(c, path, record="0", max_records="1").headers["stream-next-offset"]
    snapshot(c, path, o1, b'{"a":1}', JSON_CT)
    retain(c, path, o1)
    assert first_next(c, path) == (1, 3)
    shown = check(c.get(f"{path}/snapshot/{o1}"), 200)
    assert int_header(shown, "stream-record-next") == 1
    assert RECORDS_TOKEN in extension_tokens(shown), "record headers come with the token"
    assert read(c, path, offset="-1").json() == [{"b": 2}, {"c": 3}]
    assert ndjson(rec_read(c, path, record="1")) == [{"b": 2}, {"c": 3}]


def test_s6_10_retention_keeps_surviving_ordinals(c, bucket):
    path, o = filled(c, bucket, list("abcdef"))
    snapshot(c, path, o[4], b"s")
    retain(c, path, o[2])
    assert first_next(c, path) == (2, 6)
    r = rec_read(c, path, record="2")
    assert ndjson(r) == list("cdef")
    assert record_headers(r) == (2, 2, 6)
    check(c.get(path, params={"record": "1"}), 410)
    assert acked_range(append(c, path, '"g"', JSON_CT)) == (6, 7)
    retain(c, path, o[4])
    assert first_next(c, path) == (4, 7)
    assert ndjson(rec_read(c, path, record="4")) == list("efg")


# --- §6.12 base clients ---------------------------------------------------------------

def test_s6_12_base_reads_see_no_semantic_change(c, surface):
    path = surface()
    jstream(c, path, [{"a": 1}])
    mid = next_offset(c, path)
    append(c, path, '[{"b":2},{"c":3}]', JSON_CT)
    full = read(c, path, offset="-1")
    assert full.headers["content-type"].startswith(JSON_CT)
    assert full.json() == [{"a": 1}, {"b": 2}, {"c": 3}]
    assert read(c, path, offset=mid).json() == [{"b": 2}, {"c": 3}]
    lp = check(c.get(path, params={"offset": mid, "live": "long-poll"}), 200)
    assert lp.json() == [{"b": 2}, {"c": 3}]


def test_s6_one_body_holds_at_most_100000_messages(c, surface):
    path = surface()
    jstream(c, path, [])
    body = "[" + ",".join(["0"] * 100_001) + "]"
    r = c.post(path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "100000" in r.text, describe(r)
    assert first_next(c, path) == (0, 0), "nothing was appended"
    r = c.post(path, content="[" + ",".join(["0"] * 100_000) + "]",
               headers={"Content-Type": "application/json"})
    assert r.status_code in (200, 204), describe(r)
    assert first_next(c, path) == (0, 100_000)
