"""Unary reads (GET /v1/streams/{stream}/records, JSON): start by `seq_num`,
`timestamp` or `tail_offset` (default: the tail), `clamp`, the 416
{"tail"} rules, the `count` / `bytes` / `until` bounds, the 1000-record and
1 MiB caps, `wait` long polls, `tail` only on reads that reach the live tail,
`s2-format`, and 400 bad_query / 422 invalid for bad parameters."""

import time

import pytest

import s2lib as s2
from s2lib import (MIB, Background, b64, check, expect_416, expect_error, json_of, metered,
                   rec, unb64)


@pytest.fixture
def five(basin, stream):
    """`stream` holding records 0..4 with bodies r0..r4 and timestamps 100..500."""
    basin.ack(stream, [rec(f"r{i}", timestamp=100 * (i + 1)) for i in range(5)])
    return stream


# --- start -----------------------------------------------------------------------------

@pytest.mark.parametrize("start", [0, 2, 4])
def test_seq_num_starts_at_that_record(basin, five, start):
    got = basin.records(five, seq_num=start)
    assert s2.seq_nums(got) == list(range(start, 5))
    assert s2.bodies(got) == [f"r{i}" for i in range(start, 5)]


def test_records_carry_seq_num_and_timestamp(basin, five):
    got = basin.records(five, seq_num=0)
    assert [(r["seq_num"], r["timestamp"]) for r in got] == [(i, 100 * (i + 1)) for i in range(5)]


@pytest.mark.parametrize("ts,first", [(0, 0), (100, 0), (101, 1), (250, 2), (500, 4)])
def test_timestamp_starts_at_the_first_record_at_or_after_it(basin, five, ts, first):
    assert s2.seq_nums(basin.records(five, timestamp=ts)) == list(range(first, 5))


def test_timestamp_start_with_duplicate_timestamps_takes_the_first(basin, stream):
    basin.ack(stream, [rec("a", timestamp=10), rec("b", timestamp=20), rec("c", timestamp=20),
                       rec("d", timestamp=30)])
    assert s2.bodies(basin.records(stream, timestamp=20)) == ["b", "c", "d"]


@pytest.mark.parametrize("offset,first", [(1, 4), (3, 2), (5, 0), (6, 0), (10**6, 0)])
def test_tail_offset_starts_that_many_records_before_the_tail(basin, five, offset, first):
    assert s2.seq_nums(basin.records(five, tail_offset=offset)) == list(range(first, 5))


@pytest.mark.parametrize("params", [
    {"seq_num": 0, "timestamp": 0},
    {"seq_num": 0, "tail_offset": 1},
    {"timestamp": 0, "tail_offset": 1},
    {"seq_num": 0, "timestamp": 0, "tail_offset": 1},
])
def test_more_than_one_start_is_422_invalid(basin, five, params):
    expect_error(basin.read(five, status=422, **params), 422, "invalid")


def test_no_start_means_the_tail(basin, five):
    # At the tail with a bound and no wait there is nothing to return: 416.
    tail = expect_416(basin.read(five, status=416, count=10))
    assert tail == {"seq_num": 5, "timestamp": 500}


def test_unary_read_without_any_parameter_is_416_at_the_tail(basin, five):
    tail = expect_416(basin.read(five, status=416))
    assert tail == {"seq_num": 5, "timestamp": 500}


# --- 416 and clamp ----------------------------------------------------------------------

@pytest.mark.parametrize("params", [{"seq_num": 5}, {"tail_offset": 0}])
@pytest.mark.parametrize("bound", [{"count": 1}, {"bytes": 100}, {"until": 10**6}, {}])
def test_read_at_the_tail_with_a_bound_and_no_wait_is_416(basin, five, params, bound):
    tail = expect_416(basin.read(five, status=416, **params, **bound))
    assert tail == {"seq_num": 5, "timestamp": 500}


def test_read_at_the_tail_with_wait_0_is_416(basin, five):
    expect_416(basin.read(five, status=416, seq_num=5, wait=0))


def test_empty_stream_read_from_0_is_416_with_tail_0(basin, stream):
    assert expect_416(basin.read(stream, status=416, seq_num=0)) == {"seq_num": 0, "timestamp": 0}


@pytest.mark.parametrize("wait", [None, 1])
def test_seq_num_beyond_the_tail_is_416_without_clamp(basin, five, wait):
    params = {"seq_num": 6} if wait is None else {"seq_num": 6, "wait": wait}
    assert expect_416(basin.read(five, status=416, **params))["seq_num"] == 5


def test_timestamp_beyond_the_last_timestamp_is_416_without_clamp(basin, five):
    assert expect_416(basin.read(five, status=416, timestamp=501)) == \
        {"seq_num": 5, "timestamp": 500}


def test_clamp_starts_beyond_the_tail_reads_at_the_tail(basin, five):
    started = time.monotonic()
    body = basin.batch(five, seq_num=99, clamp="true", wait=1)
    assert body["records"] == []
    assert time.monotonic() - started >= 0.9


def test_clamp_timestamp_beyond_the_tail_waits_at_the_tail_for_new_records(basin, five):
    # 10**12 ms (2001) is beyond the last timestamp (500) but before the arrival
    # time of the new record, so the read finds it even if the append wins the race.
    reader = Background(lambda: basin.batch(five, timestamp=10**12, clamp="true", wait=8))
    basin.ack(five, ["new"])
    body = reader.result()
    assert s2.bodies(body["records"]) == ["new"]
    assert body["records"][0]["seq_num"] == 5


def test_clamp_false_is_the_default(basin, five):
    expect_416(basin.read(five, status=416, seq_num=6, clamp="false"))


# --- bounds --------------------------------------------------------------------------------

@pytest.mark.parametrize("count,expected", [(1, [0]), (3, [0, 1, 2]), (5, [0, 1, 2, 3, 4]),
                                            (50, [0, 1, 2, 3, 4])])
def test_count_limits_the_records(basin, five, count, expected):
    assert s2.seq_nums(basin.records(five, seq_num=0, count=count)) == expected


def test_count_0_returns_no_records(basin, five):
    assert basin.records(five, seq_num=0, count=0) == []


@pytest.mark.parametrize("limit", [{"count": 0}, {"bytes": 0}, {"count": 0, "bytes": 9}])
@pytest.mark.parametrize("start", [{"seq_num": 5}, {"seq_num": 99}, {"timestamp": 10**9}, {}])
def test_an_exhausted_limit_reads_nothing_even_at_or_past_the_tail(basin, five, limit, start):
    assert basin.records(five, **start, **limit) == []


def test_bytes_limits_the_metered_bytes_without_splitting_a_record(basin, five):
    one = metered("r0")
    assert basin.records(five, seq_num=0, bytes=one - 1) == []
    assert s2.seq_nums(basin.records(five, seq_num=0, bytes=one)) == [0]
    assert s2.seq_nums(basin.records(five, seq_num=0, bytes=2 * one - 1)) == [0]
    assert s2.seq_nums(basin.records(five, seq_num=0, bytes=2 * one)) == [0, 1]


def test_bytes_0_returns_no_records(basin, five):
    assert basin.records(five, seq_num=0, bytes=0) == []


def test_count_and_bytes_together_stop_at_the_first_reached(basin, five):
    one = metered("r0")
    assert s2.seq_nums(basin.records(five, seq_num=0, count=2, bytes=10 * one)) == [0, 1]
    assert s2.seq_nums(basin.records(five, seq_num=0, count=4, bytes=3 * one)) == [0, 1, 2]


@pytest.mark.parametrize("until,expected", [(101, [0]), (300, [0, 1]), (301, [0, 1, 2]),
                                            (10**9, [0, 1, 2, 3, 4])])
def test_until_is_an_exclusive_timestamp_bound(basin, five, until, expected):
    assert s2.seq_nums(basin.records(five, seq_num=0, until=until)) == expected


def test_until_at_or_below_the_first_timestamp_returns_no_records(basin, five):
    assert basin.records(five, seq_num=0, until=100) == []


@pytest.mark.parametrize("ts,until", [(300, 300), (300, 200)])
def test_start_timestamp_at_or_after_until_is_422_invalid(basin, five, ts, until):
    expect_error(basin.read(five, status=422, timestamp=ts, until=until), 422, "invalid")


# --- unary caps ---------------------------------------------------------------------------

def test_unary_read_returns_at_most_1000_records(basin, stream):
    basin.ack(stream, [str(i) for i in range(1000)])
    basin.ack(stream, ["1000", "1001"])
    assert s2.seq_nums(basin.records(stream, seq_num=0)) == list(range(1000))
    assert len(basin.records(stream, seq_num=0, count=5000)) == 1000
    assert s2.seq_nums(basin.records(stream, seq_num=1000)) == [1000, 1001]


def test_unary_read_returns_at_most_1_mib_metered(basin, stream):
    size = 400 * 1024
    for i in range(3):
        basin.ack(stream, [str(i) * (size - 8)])
    got = basin.records(stream, seq_num=0)
    assert s2.seq_nums(got) == [0, 1]
    assert sum(metered(r["body"]) for r in got) <= MIB
    assert s2.seq_nums(basin.records(stream, seq_num=0, bytes=10 * MIB)) == [0, 1]
    assert s2.seq_nums(basin.records(stream, seq_num=2)) == [2]


def test_unary_read_of_exactly_1_mib_returns_it_all(basin, stream):
    a = "a" * (MIB // 2 - 8)
    basin.ack(stream, [a])
    basin.ack(stream, [a])
    assert s2.seq_nums(basin.records(stream, seq_num=0)) == [0, 1]


# --- tail in the response --------------------------------------------------------------

def test_read_that_stops_short_of_the_tail_has_no_tail(basin, five):
    body = basin.batch(five, seq_num=0, count=2)
    assert body.get("tail") is None


def test_long_poll_woken_by_an_append_carries_the_tail(basin, stream):
    # The append may land before the read reaches the server; retry until the
    # read was the one waiting (then the batch is live and has a tail).
    for attempt in range(5):
        nxt = basin.tail(stream)["seq_num"]
        reader = Background(lambda: basin.batch(stream, seq_num=nxt, wait=8))
        basin.ack(stream, [f"live {attempt}"])
        body = reader.result()
        assert s2.bodies(body["records"]) == [f"live {attempt}"]
        if body.get("tail") is not None:
            assert body["tail"]["seq_num"] == nxt + 1
            assert body["tail"]["timestamp"] == body["records"][-1]["timestamp"]
            return
    pytest.fail("no long poll was woken by the append in 5 tries (all found the record already)")


# --- wait (long poll) -------------------------------------------------------------------

def test_a_wait_on_a_stream_deleted_meanwhile_is_404(c, basin, stream):
    nxt = basin.tail(stream)["seq_num"]
    reader = Background(lambda: basin.read(stream, 404, seq_num=nxt, wait=8))
    time.sleep(0.3)  # the read is waiting (if not yet, it finds the stream gone: 404 too)
    s2.check(c.delete(s2.stream_path(stream), headers=basin.headers()), 202)
    started = time.monotonic()
    reader.result()
    assert time.monotonic() - started < 5, "answered when the stream went, not at the wait's end"


def test_wait_at_the_tail_returns_empty_records_when_it_expires(basin, five):
    started = time.monotonic()
    body = basin.batch(five, seq_num=5, wait=1)
    elapsed = time.monotonic() - started
    assert body == {"records": []}
    assert 0.9 <= elapsed < s2.WAIT_S


def test_wait_with_records_available_returns_at_once(basin, five):
    started = time.monotonic()
    got = basin.records(five, seq_num=3, wait=30)
    assert s2.seq_nums(got) == [3, 4]
    assert time.monotonic() - started < 5


def test_wait_returns_as_soon_as_a_record_is_appended(basin, five):
    started = time.monotonic()
    reader = Background(lambda: basin.batch(five, seq_num=5, wait=30))
    basin.ack(five, ["woken"])
    body = reader.result()
    assert s2.bodies(body["records"]) == ["woken"]
    assert time.monotonic() - started < s2.WAIT_S


def test_wait_above_60_seconds_is_accepted_and_capped(basin, five):
    reader = Background(lambda: basin.batch(five, seq_num=5, wait=3600))
    basin.ack(five, ["capped"])
    assert s2.bodies(reader.result()["records"]) == ["capped"]


def test_wait_with_count_returns_the_new_records_up_to_count(basin, five):
    reader = Background(lambda: basin.batch(five, seq_num=5, count=1, wait=8))
    basin.ack(five, ["x", "y"])
    body = reader.result()
    assert s2.seq_nums(body["records"]) == [5]


# --- format --------------------------------------------------------------------------------

def test_base64_read_encodes_bodies_and_headers(basin, stream):
    basin.ack(stream, [rec("body", headers=[["k", "v"]])])
    [got] = basin.records(stream, fmt="base64", seq_num=0)
    assert unb64(got["body"]) == b"body"
    assert got["headers"] == [[b64("k"), b64("v")]]


def test_read_with_accept_application_json_is_json(basin, five):
    r = basin.read(five, headers={"accept": "application/json"}, seq_num=0)
    assert s2.media_type(r.headers["content-type"]) == s2.JSON_CT
    assert len(r.json()["records"]) == 5


# --- bad parameters ---------------------------------------------------------------------

@pytest.mark.parametrize("params", [
    {"seq_num": "abc"}, {"seq_num": "-1"}, {"seq_num": "1.5"},
    {"timestamp": "yesterday"}, {"tail_offset": "-1"},
    {"count": "-1"}, {"count": "x"}, {"bytes": "-5"}, {"until": "later"},
    {"wait": "-1"}, {"wait": "soon"}, {"clamp": "maybe"},
])
def test_malformed_query_parameter_is_400_bad_query(basin, five, params):
    expect_error(basin.read(five, status=400, **params), 400, "bad_query")


@pytest.mark.parametrize("name", ["seq_num", "count"])
def test_a_repeated_query_parameter_is_400_bad_query(basin, five, name):
    r = basin.c.get(f"{s2.records_path(five)}?{name}=1&{name}=2", headers=basin.headers())
    expect_error(r, 400, "bad_query")


def test_check_tail_on_a_missing_stream_is_404(basin):
    expect_error(basin.c.get(s2.tail_path("missing"), headers=basin.headers()), 404,
                 "stream_not_found")


def test_check_tail_has_only_the_tail(basin, five):
    body = json_of(basin.c.get(s2.tail_path(five), headers=basin.headers()))
    assert body == {"tail": {"seq_num": 5, "timestamp": 500}}
    check(basin.c.get(s2.tail_path(five), headers=basin.headers()), 200)
