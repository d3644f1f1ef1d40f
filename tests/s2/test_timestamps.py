"""Record timestamps (s2-notes §1 "Timestamps"): the stream's timestamping mode
(client-prefer by default, client-require, arrival), capping at the arrival
time unless `uncapped`, and the monotonic raise within and across batches."""

import pytest

import s2lib as s2
from s2lib import expect_error, now_ms, rec

HOUR_MS = 3600 * 1000


def stream_with(basin, mode=None, uncapped=None):
    ts = {}
    if mode is not None:
        ts["mode"] = mode
    if uncapped is not None:
        ts["uncapped"] = uncapped
    return basin.create_stream(config={"timestamping": ts})


def timestamps(basin, stream):
    return [r["timestamp"] for r in basin.all_records(stream)]


# --- client-prefer (default) --------------------------------------------------------

def test_client_timestamp_is_kept_by_default(basin, stream):
    basin.ack(stream, [rec("a", timestamp=1234), rec("b", timestamp=5678)])
    assert timestamps(basin, stream) == [1234, 5678]


def test_missing_timestamp_gets_the_arrival_time(basin, stream):
    before = now_ms()
    basin.ack(stream, ["a"])
    after = now_ms()
    [ts] = timestamps(basin, stream)
    assert before <= ts <= after


def test_client_prefer_mixes_client_and_arrival_timestamps(basin):
    stream = stream_with(basin, "client-prefer")
    before = now_ms()
    basin.ack(stream, [rec("a", timestamp=100), rec("b")])
    after = now_ms()
    first, second = timestamps(basin, stream)
    assert first == 100
    assert before <= second <= after


# --- client-require ------------------------------------------------------------------

def test_client_require_rejects_a_record_without_timestamp_with_422_invalid(basin):
    stream = stream_with(basin, "client-require")
    r = basin.append(stream, [rec("a", timestamp=10), rec("b")], status=422)
    expect_error(r, 422, "invalid")
    assert basin.tail(stream)["seq_num"] == 0


def test_client_require_accepts_records_with_timestamps(basin):
    stream = stream_with(basin, "client-require")
    basin.ack(stream, [rec("a", timestamp=10), rec("b", timestamp=20)])
    assert timestamps(basin, stream) == [10, 20]


# --- arrival ---------------------------------------------------------------------------

def test_arrival_mode_ignores_client_timestamps(basin):
    stream = stream_with(basin, "arrival")
    before = now_ms()
    basin.ack(stream, [rec("a", timestamp=5), rec("b", timestamp=now_ms() + HOUR_MS)])
    after = now_ms()
    for ts in timestamps(basin, stream):
        assert before <= ts <= after


# --- capping at arrival time ------------------------------------------------------------

def test_future_timestamp_is_capped_to_the_arrival_time(basin, stream):
    future = now_ms() + HOUR_MS
    basin.ack(stream, [rec("a", timestamp=future)])
    after = now_ms()
    [ts] = timestamps(basin, stream)
    assert ts <= after


def test_uncapped_keeps_future_timestamps(basin):
    stream = stream_with(basin, "client-prefer", uncapped=True)
    future = now_ms() + HOUR_MS
    ack = basin.ack(stream, [rec("a", timestamp=future)])
    assert ack["end"]["timestamp"] == future
    assert timestamps(basin, stream) == [future]


def test_an_uncapped_timestamp_past_what_a_record_holds_is_acknowledged_as_stored(basin):
    stream = stream_with(basin, "client-prefer", uncapped=True)
    ack = basin.ack(stream, [rec("a", timestamp=2**64 - 1)])
    latest = 2**63 - 1  # milliseconds since the epoch in a signed 64-bit integer
    assert ack["end"]["timestamp"] == latest
    assert ack["tail"]["timestamp"] == latest
    assert timestamps(basin, stream) == [latest]


def test_uncapped_can_be_turned_on_by_reconfiguration(c, basin, stream):
    s2.json_of(c.patch(s2.stream_path(stream), json={"timestamping": {"uncapped": True}},
                       headers=basin.headers()))
    future = now_ms() + HOUR_MS
    basin.ack(stream, [rec("a", timestamp=future)])
    assert timestamps(basin, stream) == [future]


# --- monotonic --------------------------------------------------------------------------

def test_timestamps_are_raised_to_the_previous_within_a_batch(basin, stream):
    basin.ack(stream, [rec("a", timestamp=5000), rec("b", timestamp=3000),
                       rec("c", timestamp=7000), rec("d", timestamp=6999)])
    assert timestamps(basin, stream) == [5000, 5000, 7000, 7000]


def test_timestamps_are_raised_to_the_previous_across_batches(basin, stream):
    basin.ack(stream, [rec("a", timestamp=9000)])
    ack = basin.ack(stream, [rec("b", timestamp=1000)])
    assert ack["start"]["timestamp"] == 9000
    assert timestamps(basin, stream) == [9000, 9000]


def test_equal_timestamps_are_allowed(basin, stream):
    basin.ack(stream, [rec("a", timestamp=42), rec("b", timestamp=42)])
    basin.ack(stream, [rec("c", timestamp=42)])
    assert timestamps(basin, stream) == [42, 42, 42]


def test_arrival_timestamps_never_go_below_an_earlier_client_timestamp(basin):
    stream = stream_with(basin, "client-prefer", uncapped=True)
    future = now_ms() + HOUR_MS
    basin.ack(stream, [rec("a", timestamp=future)])
    basin.ack(stream, ["b"])
    assert timestamps(basin, stream) == [future, future]


@pytest.mark.parametrize("mode", ["client-prefer", "client-require", "arrival"])
def test_timestamps_read_back_non_decreasing_in_every_mode(basin, mode):
    stream = stream_with(basin, mode)
    for ts in (300, 100, 200):
        basin.ack(stream, [rec("x", timestamp=ts), rec("y", timestamp=ts - 50)])
    got = timestamps(basin, stream)
    assert got == sorted(got) and len(got) == 6
