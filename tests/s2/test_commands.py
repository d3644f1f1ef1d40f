"""Command records (s2-notes §2 "Command records"): `fence` sets the fencing
token that conditional appends must carry (412 {"fencing_token_mismatch"}),
`trim` moves the stream's first record. Both consume a seq_num, read back
through S2 with one empty-named header, and are invisible to Durable Streams
reads; trimmed offsets there are 410."""

import struct

import pytest

import s2lib as s2
from s2lib import (DS_START, TRIM_METERED, U64_MAX, b64, check, expect_error, fence,
                   fence_metered, json_of, rec, trim_b64, unb64)


def trim(basin, stream, seq_num):
    return basin.ack(stream, [trim_b64(seq_num)], fmt="base64")


# --- fence -------------------------------------------------------------------------------

def test_fence_record_consumes_a_seq_num_and_reads_back_as_a_command(basin, stream):
    basin.ack(stream, ["a"])
    ack = basin.ack(stream, [fence("tok-1")])
    assert (ack["start"]["seq_num"], ack["end"]["seq_num"]) == (1, 2)
    got = basin.records(stream, seq_num=1)
    assert got == [{"seq_num": 1, "timestamp": got[0]["timestamp"],
                    "headers": [["", "fence"]], "body": "tok-1"}]


def test_fence_with_empty_token_reads_back_without_a_body(basin, stream):
    basin.ack(stream, [fence("")])
    [got] = basin.records(stream, seq_num=0)
    assert got["headers"] == [["", "fence"]]
    assert "body" not in got


def test_fence_reads_back_base64_encoded_in_base64_format(basin, stream):
    basin.ack(stream, [fence("tok")])
    [got] = basin.records(stream, fmt="base64", seq_num=0)
    assert got["headers"] == [["", b64("fence")]]
    assert unb64(got["body"]) == b"tok"


def test_fencing_token_starts_empty(basin, stream):
    basin.ack(stream, ["a"], fencing_token="")
    r = basin.append(stream, ["b"], status=412, fencing_token="something")
    assert json_of(r, 412) == {"fencing_token_mismatch": ""}


def test_append_with_the_current_fencing_token_succeeds(basin, stream):
    basin.ack(stream, [fence("owner-a")])
    ack = basin.ack(stream, ["by a"], fencing_token="owner-a")
    assert ack["start"]["seq_num"] == 1


def test_append_with_another_fencing_token_is_412_with_the_current_token(basin, stream):
    basin.ack(stream, [fence("owner-a")])
    basin.ack(stream, ["x"])
    r = basin.append(stream, ["by b"], status=412, fencing_token="owner-b")
    assert json_of(r, 412) == {"fencing_token_mismatch": "owner-a"}
    assert basin.tail(stream)["seq_num"] == 2


def test_append_without_fencing_token_is_never_fenced(basin, stream):
    basin.ack(stream, [fence("owner-a")])
    assert basin.ack(stream, ["anyone"])["start"]["seq_num"] == 1


def test_fence_can_take_over_with_the_current_token(basin, stream):
    basin.ack(stream, [fence("old")])
    basin.ack(stream, [fence("new")], fencing_token="old")
    r = basin.append(stream, ["late"], status=412, fencing_token="old")
    assert json_of(r, 412) == {"fencing_token_mismatch": "new"}
    basin.ack(stream, ["ok"], fencing_token="new")


def test_fencing_is_checked_before_match_seq_num(basin, stream):
    basin.ack(stream, [fence("t")])
    r = basin.append(stream, ["x"], status=412, fencing_token="u", match_seq_num=99)
    assert json_of(r, 412) == {"fencing_token_mismatch": "t"}
    r = basin.append(stream, ["x"], status=412, fencing_token="t", match_seq_num=99)
    assert json_of(r, 412) == {"seq_num_mismatch": 1}


def test_fence_token_of_36_bytes_is_accepted(basin, stream):
    basin.ack(stream, [fence("t" * 36)])
    basin.ack(stream, ["x"], fencing_token="t" * 36)


@pytest.mark.parametrize("token", ["t" * 37, "é" * 19])
def test_fence_token_over_36_bytes_is_422_invalid(basin, stream, token):
    expect_error(basin.append(stream, [fence(token)], status=422), 422, "invalid")
    assert basin.tail(stream)["seq_num"] == 0


def test_fence_and_data_records_in_one_batch(basin, stream):
    ack = basin.ack(stream, ["a", fence("mid"), "b"])
    assert ack["end"]["seq_num"] == 3
    got = basin.records(stream, seq_num=0)
    assert [r.get("headers") for r in got] == [None, [["", "fence"]], None]
    basin.ack(stream, ["c"], fencing_token="mid")


def test_fence_records_are_invisible_to_durable_streams_reads(c, basin, stream):
    basin.ack(stream, ["ab", fence("tok"), "cd"])
    basin.ack(stream, [fence("")])
    basin.ack(stream, ["ef"])
    assert s2.ds_read(c, basin.name, stream).content == b"abcdef"


def test_fencing_applies_to_records_but_not_to_durable_streams_appends(c, basin, stream):
    # A Durable Streams POST carries no fencing token, so it is never fenced.
    basin.ack(stream, [fence("tok")])
    s2.ds_append(c, basin.name, stream, b"ds")
    assert basin.tail(stream)["seq_num"] == 2


# --- trim ------------------------------------------------------------------------------

def test_trim_record_consumes_a_seq_num_and_reads_back_as_a_command(basin, stream):
    basin.ack(stream, ["a", "b", "c"])
    ack = trim(basin, stream, 2)
    assert (ack["start"]["seq_num"], ack["end"]["seq_num"]) == (3, 4)
    [got] = basin.records(stream, fmt="base64", seq_num=3)
    assert got["headers"] == [["", b64("trim")]]
    assert unb64(got["body"]) == struct.pack(">Q", 2)
    [raw] = basin.records(stream, seq_num=3)
    assert raw["headers"] == [["", "trim"]]


def test_trim_can_be_sent_in_raw_format(basin, stream):
    basin.ack(stream, ["a", "b"])
    raw_body = struct.pack(">Q", 1).decode()  # control characters: valid UTF-8
    basin.ack(stream, [{"headers": [["", "trim"]], "body": raw_body}])
    assert s2.seq_nums(basin.records(stream, seq_num=0)) == [1, 2]


@pytest.mark.parametrize("start", [0, 1, 2])
def test_reads_of_trimmed_seq_nums_start_at_the_trim_point(basin, stream, start):
    basin.ack(stream, ["a", "b", "c"])
    trim(basin, stream, 2)
    got = basin.records(stream, seq_num=start)
    assert s2.seq_nums(got) == [2, 3]
    assert got[0]["body"] == "c"


def test_trim_past_itself_stops_after_the_trim_record(basin, stream):
    basin.ack(stream, ["a", "b", "c"])
    trim(basin, stream, U64_MAX)
    assert basin.tail(stream)["seq_num"] == 4
    basin.ack(stream, ["d"])
    got = basin.records(stream, seq_num=0)
    assert s2.seq_nums(got) == [4]
    assert got[0]["body"] == "d"


def test_trim_to_its_own_seq_num_keeps_the_trim_record(basin, stream):
    basin.ack(stream, ["a", "b"])
    trim(basin, stream, 2)
    assert s2.seq_nums(basin.records(stream, seq_num=0)) == [2]


def test_trim_point_never_moves_back(basin, stream):
    basin.ack(stream, ["a", "b", "c", "d"])
    trim(basin, stream, 3)
    trim(basin, stream, 1)
    assert s2.seq_nums(basin.records(stream, seq_num=0)) == [3, 4, 5]


def test_trim_does_not_change_the_tail(basin, stream):
    basin.ack(stream, ["a", "b"])
    trim(basin, stream, 2)
    assert basin.tail(stream)["seq_num"] == 3
    assert basin.ack(stream, ["c"])["start"]["seq_num"] == 3


def test_trim_in_a_batch_with_data_records(basin, stream):
    ack = basin.ack(stream, [b64("a"), b64("b"), trim_b64(1), b64("c")], fmt="base64")
    assert ack["end"]["seq_num"] == 4
    assert s2.seq_nums(basin.records(stream, seq_num=0)) == [1, 2, 3]


@pytest.mark.parametrize("body", [b"", b"\x00" * 7, b"\x00" * 9])
def test_trim_body_that_is_not_8_bytes_is_422_invalid(basin, stream, body):
    r = basin.append(stream, [{"headers": [["", b64("trim")]], "body": b64(body)}],
                     status=422, fmt="base64")
    expect_error(r, 422, "invalid")


def test_trimmed_offsets_are_410_on_the_durable_streams_face(c, basin, stream):
    basin.ack(stream, ["a", "b", "c"])
    trim(basin, stream, 2)
    check(c.get(s2.ds_path(basin.name, stream), params={"offset": DS_START}), 410)


def test_durable_streams_read_from_the_start_sees_only_retained_bytes(c, basin, stream):
    basin.ack(stream, ["a", "b", "c"])
    trim(basin, stream, 2)
    basin.ack(stream, ["d"])
    assert s2.ds_read(c, basin.name, stream).content == b"cd"


def test_a_trim_past_a_durable_streams_snapshot_takes_the_snapshot_with_it(c, basin, stream):
    # A snapshot at record 1 followed by records trimmed away would make /bootstrap skip them.
    path = s2.ds_path(basin.name, stream)
    basin.ack(stream, ["a"])
    after_a = s2.ds_head(c, basin.name, stream).headers["stream-next-offset"]
    basin.ack(stream, ["b", "c", "d"])
    check(c.put(f"{path}/snapshot/{after_a}", content=b"state after a",
                headers={"content-type": "text/plain"}), (200, 201, 204))
    trim(basin, stream, 3)
    check(c.get(f"{path}/snapshot", follow_redirects=False), 404)
    boot = check(c.get(f"{path}/bootstrap"), 200)
    assert boot.headers["stream-snapshot-offset"] == "-1", boot.headers
    assert b"state after a" not in boot.content


# --- metering of commands ------------------------------------------------------------

def test_command_records_are_metered_like_one_empty_named_header(basin, stream):
    basin.ack(stream, [fence("tok")])
    trim(basin, stream, 0)
    basin.ack(stream, ["x"])
    f = fence_metered("tok")
    assert f == 18 and TRIM_METERED == 22
    assert s2.seq_nums(basin.records(stream, seq_num=0, bytes=f - 1)) == []
    assert s2.seq_nums(basin.records(stream, seq_num=0, bytes=f)) == [0]
    assert s2.seq_nums(basin.records(stream, seq_num=0, bytes=f + TRIM_METERED - 1)) == [0]
    assert s2.seq_nums(basin.records(stream, seq_num=0, bytes=f + TRIM_METERED)) == [0, 1]
    total = f + TRIM_METERED + s2.metered("x")
    assert s2.seq_nums(basin.records(stream, seq_num=0, bytes=total)) == [0, 1, 2]


def test_command_record_timestamps_follow_the_stream_rules(basin, stream):
    basin.ack(stream, [rec("a", timestamp=500)])
    basin.ack(stream, [dict(fence("t"), timestamp=100)])
    got = basin.records(stream, seq_num=0)
    assert [r["timestamp"] for r in got] == [500, 500]
