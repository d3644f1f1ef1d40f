"""SSE read sessions (`Accept: text/event-stream`): `batch` events with
`id: seq_num,count,bytes` (cumulative), a `ping` on catching up, live batches
with `tail`, `data: [DONE]` on a normal end (count / bytes / until reached,
wait expired), `error` events, `Last-Event-ID` resumption, plain HTTP errors
before the stream starts, and `s2-format`."""

import time

import pytest

import s2lib as s2
from s2lib import (b64, batch_records, batches, event_id, expect_416, expect_error, fence,
                   fence_metered, metered, rec, unb64)


@pytest.fixture
def five(basin, stream):
    """`stream` holding records 0..4 with bodies r0..r4 and timestamps 100..500."""
    basin.ack(stream, [rec(f"r{i}", timestamp=100 * (i + 1)) for i in range(5)])
    return stream


ONE = metered("r0")  # every r<i> record has the same metered size


def check_ids(events):
    """Batch ids: last seq_num of the batch, then cumulative count and bytes."""
    count = size = 0
    for ev in batches(events):
        records = ev.json()["records"]
        assert records, f"empty batch event: {ev}"
        count += len(records)
        size += sum(metered(r.get("body", ""), r.get("headers", [])) for r in records)
        assert event_id(ev) == (records[-1]["seq_num"], count, size), ev


# --- framing ------------------------------------------------------------------------------

def test_sse_response_is_an_event_stream(basin, five):
    with basin.sse(five, seq_num=0, count=5) as s:
        s.expect_ok()
        cache = s.response.headers.get("cache-control", "")
        assert "no-cache" in cache


def test_bounded_session_sends_batches_then_done(basin, five):
    with basin.sse(five, seq_num=0, count=5) as s:
        events = s.expect_ok().rest()
    assert events[-1].done, events
    assert all(e.type == "batch" for e in events[:-1]), events
    assert s2.bodies(batch_records(events)) == [f"r{i}" for i in range(5)]
    check_ids(events)
    assert event_id(events[-2]) == (4, 5, 5 * ONE)


def test_batch_event_data_is_a_read_batch(basin, five):
    with basin.sse(five, seq_num=0, count=2) as s:
        events = s.expect_ok().rest()
    for ev in batches(events):
        data = ev.json()
        assert set(data) <= {"records", "tail"}
        for r in data["records"]:
            assert set(r) == {"seq_num", "timestamp", "body"}


def test_count_stops_the_session_with_done(basin, five):
    with basin.sse(five, seq_num=1, count=2) as s:
        events = s.expect_ok().rest()
    assert events[-1].done
    assert s2.seq_nums(batch_records(events)) == [1, 2]
    assert event_id(batches(events)[-1]) == (2, 2, 2 * ONE)


@pytest.mark.parametrize("start", [{"seq_num": 0}, {"seq_num": 99}])
def test_an_exhausted_limit_ends_the_session_with_done_and_no_records(basin, five, start):
    with basin.sse(five, count=0, **start) as s:
        events = s.expect_ok().rest()
    assert events[-1].done, events
    assert batch_records(events) == []


def test_bytes_stops_the_session_with_done(basin, five):
    with basin.sse(five, seq_num=0, bytes=3 * ONE - 1) as s:
        events = s.expect_ok().rest()
    assert events[-1].done
    assert s2.seq_nums(batch_records(events)) == [0, 1]


def test_until_stops_the_session_with_done(basin, five):
    with basin.sse(five, seq_num=0, until=300) as s:
        events = s.expect_ok().rest()
    assert events[-1].done
    assert s2.seq_nums(batch_records(events)) == [0, 1]


def test_bounded_session_reaching_the_tail_ends_with_done(basin, five):
    with basin.sse(five, seq_num=3, count=100) as s:
        events = s.expect_ok().rest()
    assert events[-1].done
    assert s2.seq_nums(batch_records(events)) == [3, 4]
    assert not [e for e in events if e.type == "error"]


def test_batches_that_stop_short_of_the_tail_have_no_tail(basin, five):
    with basin.sse(five, seq_num=0, count=2) as s:
        events = s.expect_ok().rest()
    for ev in batches(events):
        assert ev.json().get("tail") is None


# --- following -----------------------------------------------------------------------------

def test_ping_is_sent_on_catching_up_with_the_tail(basin, five):
    before = s2.now_ms()
    with basin.sse(five, seq_num=0) as s:
        events = s.expect_ok().until_ping()
    assert s2.seq_nums(batch_records(events)) == [0, 1, 2, 3, 4]
    ping = events[-1].json()
    assert ping["tail"] == {"seq_num": 5, "timestamp": 500}
    assert before - 1000 <= ping["timestamp"] <= s2.now_ms() + 1000
    assert events[-1].id is None


def test_session_without_start_begins_at_the_tail_and_pings(basin, five):
    with basin.sse(five) as s:
        events = s.expect_ok().until_ping()
    assert batch_records(events) == []
    assert events[-1].json()["tail"]["seq_num"] == 5


def test_live_record_arrives_in_a_batch_with_the_tail(basin, five):
    with basin.sse(five, seq_num=0) as s:
        s.expect_ok().until_ping()
        ack = basin.ack(five, ["live"])
        events = s.until(lambda e: e.type == "batch")
    live = events[-1].json()
    assert s2.bodies(live["records"]) == ["live"]
    assert live["records"][0]["seq_num"] == 5
    assert live["tail"] == {"seq_num": 6, "timestamp": ack["end"]["timestamp"]}
    assert event_id(events[-1]) == (5, 6, 5 * ONE + metered("live"))


def test_ids_stay_cumulative_across_live_batches(basin, stream):
    with basin.sse(stream, seq_num=0) as s:
        s.expect_ok().until_ping()
        for text in ("one", "three", "fifteen"):
            basin.ack(stream, [text, text])
        s.until(lambda e: e.type == "batch" and event_id(e)[1] == 6)
    check_ids(s.events)


def test_session_on_an_empty_stream_sees_the_first_record(basin, stream):
    with basin.sse(stream, seq_num=0) as s:
        ping = s.expect_ok().until_ping()[-1].json()
        assert ping["tail"] == {"seq_num": 0, "timestamp": 0}
        basin.ack(stream, [rec("first", headers=[["h", "v"]])])
        events = s.until(lambda e: e.type == "batch")
    [got] = events[-1].json()["records"]
    assert got["body"] == "first" and got["headers"] == [["h", "v"]]


def test_wait_expiry_at_the_tail_ends_the_session_with_done(basin, five):
    started = time.monotonic()
    with basin.sse(five, seq_num=5, wait=1) as s:
        events = s.expect_ok().rest()
    elapsed = time.monotonic() - started
    assert {e.type for e in events if not e.done} == {"ping"}, events
    assert events[-1].done
    assert 0.9 <= elapsed < s2.WAIT_S


def test_wait_ends_the_session_with_done_after_an_idle_gap_following_a_batch(basin, five):
    with basin.sse(five, seq_num=0, wait=2) as s:
        s.expect_ok().until_ping()
        basin.ack(five, ["keep alive"])
        s.until(lambda e: e.type == "batch" and e.json()["records"][-1]["seq_num"] == 5)
        events = s.rest()
    assert events[-1].done


def test_bounded_session_with_wait_follows_until_count_is_reached(basin, five):
    # A bound alone makes the session end at the tail; wait > 0 lets it follow.
    with basin.sse(five, seq_num=4, count=3, wait=5) as s:
        s.expect_ok().until(lambda e: e.type == "batch")
        basin.ack(five, ["a"])
        basin.ack(five, ["b", "c"])
        events = s.rest()
    assert events[-1].done
    assert s2.seq_nums(batch_records(s.events)) == [4, 5, 6]


# --- clamp and errors before the stream -----------------------------------------------------

def test_start_beyond_the_tail_is_a_plain_416_without_clamp(basin, five):
    with basin.sse(five, seq_num=6) as s:
        assert expect_416(s.response) == {"seq_num": 5, "timestamp": 500}


def test_start_beyond_the_tail_with_clamp_follows_from_the_tail(basin, five):
    with basin.sse(five, seq_num=100, clamp="true") as s:
        events = s.expect_ok().until_ping()
        assert events[-1].json()["tail"]["seq_num"] == 5
        basin.ack(five, ["after clamp"])
        events = s.until(lambda e: e.type == "batch")
    assert s2.seq_nums(events[-1].json()["records"]) == [5]


def test_start_at_the_tail_with_a_bound_and_no_wait_is_a_plain_416(basin, five):
    with basin.sse(five, seq_num=5, count=1) as s:
        expect_416(s.response)


def test_bad_query_is_a_plain_400(basin, five):
    with basin.sse(five, seq_num="x") as s:
        expect_error(s.response, 400, "bad_query")


def test_error_event_ends_the_session_without_done(c, basin, stream):
    basin.ack(stream, ["a"])
    with basin.sse(stream, seq_num=0) as s:
        s.expect_ok().until_ping()
        s2.check(c.delete(s2.stream_path(stream), headers=basin.headers()), 202)
        events = s.rest()
    errors = [e for e in events if e.type == "error"]
    assert errors, f"no error event after the stream was deleted: {events}"
    assert events[-1] is errors[-1], events
    assert not any(e.done for e in events)
    info = errors[-1].json()
    assert isinstance(info.get("code"), str) and isinstance(info.get("message"), str)


# --- Last-Event-ID -----------------------------------------------------------------------------

def test_last_event_id_resumes_after_its_seq_num(basin, five):
    with basin.sse(five, seq_num=0, count=2) as s:
        first = s.expect_ok().rest()
    last_id = batches(first)[-1].id
    assert last_id == f"1,2,{2 * ONE}"
    with basin.sse(five, headers={"last-event-id": last_id}, seq_num=0, count=4) as s:
        events = s.expect_ok().rest()
    assert events[-1].done
    assert s2.seq_nums(batch_records(events)) == [2, 3]
    assert event_id(batches(events)[-1]) == (3, 4, 4 * ONE)


def test_last_event_id_reduces_the_bytes_limit(basin, five):
    with basin.sse(five, headers={"last-event-id": f"0,1,{ONE}"}, seq_num=0, bytes=3 * ONE) as s:
        events = s.expect_ok().rest()
    assert s2.seq_nums(batch_records(events)) == [1, 2]
    assert event_id(batches(events)[-1]) == (2, 3, 3 * ONE)


def test_last_event_id_overrides_the_query_start(basin, five):
    with basin.sse(five, headers={"last-event-id": "2,9,999"}, timestamp=100, count=100) as s:
        events = s.expect_ok().rest()
    assert s2.seq_nums(batch_records(events)) == [3, 4]
    assert event_id(batches(events)[-1]) == (4, 11, 999 + 2 * ONE)


def test_last_event_id_totals_saturate_rather_than_wrap(basin, five):
    top = 2**64 - 1
    with basin.sse(five, headers={"last-event-id": f"0,{top},0"}, seq_num=0, bytes=2 * ONE) as s:
        events = s.expect_ok().rest()
    assert s2.seq_nums(batch_records(events)) == [1, 2]
    assert event_id(batches(events)[-1]) == (2, top, 2 * ONE)


@pytest.mark.parametrize("bad", ["x", "1", "1,2", "1,2,x", "-1,0,0", "a,b,c"])
def test_malformed_last_event_id_is_400_bad_header(basin, five, bad):
    with basin.sse(five, headers={"last-event-id": bad}, seq_num=0) as s:
        expect_error(s.response, 400, "bad_header")


# --- content --------------------------------------------------------------------------------

def test_base64_format_applies_to_sse_records(basin, stream):
    basin.ack(stream, [rec(b64(b"\x00\xff"), headers=[[b64("k"), b64(b"\x01")]])], fmt="base64")
    with basin.sse(stream, fmt="base64", seq_num=0, count=1) as s:
        events = s.expect_ok().rest()
    [got] = batch_records(events)
    assert unb64(got["body"]) == b"\x00\xff"
    assert got["headers"] == [[b64("k"), b64(b"\x01")]]


def test_command_records_appear_in_sse_and_count_in_the_id(basin, stream):
    basin.ack(stream, ["a", fence("tok"), "b"])
    with basin.sse(stream, seq_num=0, count=3) as s:
        events = s.expect_ok().rest()
    got = batch_records(events)
    assert got[1]["headers"] == [["", "fence"]] and got[1]["body"] == "tok"
    assert event_id(batches(events)[-1]) == (2, 3, 2 * metered("a") + fence_metered("tok"))
