"""One stream, two faces: an S2 stream is the bucketed Durable Streams stream
/{basin}/{stream}. S2-created streams are byte streams whose DS reads are the
record bodies concatenated; DS appends show up in S2 as header-less records
with the arrival timestamp; on application/json streams every S2 record body
must be one JSON value and reads return the normalised JSON; seq_num N is the
DS record ordinal N."""

import json
import time

import pytest

import s2lib as s2
from s2lib import (JSON_CT, OCTET, Background, b64, check, ds_append, ds_create, ds_head,
                   ds_path, ds_read, expect_error, fence, media_type, now_ms, rec, unb64)

NDJSON = "application/x-ndjson"


def ndjson_lines(r):
    assert media_type(r.headers.get("content-type")) == NDJSON, s2.describe(r)
    body = r.content
    if not body:
        return []
    assert body.endswith(b"\n"), body[-50:]
    return body[:-1].split(b"\n")


# --- byte streams ---------------------------------------------------------------------------

def test_stream_created_through_s2_is_an_octet_stream(c, basin, stream):
    assert media_type(ds_head(c, basin.name, stream).headers.get("content-type")) == OCTET


def test_durable_streams_read_is_the_record_bodies_concatenated(c, basin, stream):
    basin.ack(stream, [rec("hello ", headers=[["h", "invisible"]]), "wor"])
    basin.ack(stream, ["ld", {}])
    r = ds_read(c, basin.name, stream)
    assert r.content == b"hello world"
    assert media_type(r.headers.get("content-type")) == OCTET


def test_binary_s2_records_read_back_exactly_on_durable_streams(c, basin, stream):
    data = bytes(range(256))
    basin.ack(stream, [b64(data[:100]), b64(data[100:])], fmt="base64")
    assert ds_read(c, basin.name, stream).content == data


def test_durable_streams_appends_are_s2_records_without_headers(c, basin, stream):
    basin.ack(stream, [rec("s2", headers=[["k", "v"]])])
    before = now_ms()
    ds_append(c, basin.name, stream, b"ds one")
    ds_append(c, basin.name, stream, b"ds two")
    after = now_ms()
    got = basin.records(stream, seq_num=0)
    assert s2.seq_nums(got) == [0, 1, 2]
    assert s2.bodies(got) == ["s2", "ds one", "ds two"]
    assert got[0]["headers"] == [["k", "v"]]
    for r in got[1:]:
        assert "headers" not in r
        assert before <= r["timestamp"] <= after


def test_durable_streams_append_timestamps_stay_monotonic(c, basin):
    stream = basin.create_stream(config={"timestamping": {"uncapped": True}})
    future = now_ms() + 3600 * 1000
    basin.ack(stream, [rec("future", timestamp=future)])
    ds_append(c, basin.name, stream, b"now")
    assert [r["timestamp"] for r in basin.records(stream, seq_num=0)] == [future, future]


def test_s2_and_durable_streams_appends_share_one_sequence(c, basin, stream):
    basin.ack(stream, ["a"])
    ds_append(c, basin.name, stream, b"b")
    ack = basin.ack(stream, ["c", "d"])
    assert (ack["start"]["seq_num"], ack["end"]["seq_num"]) == (2, 4)
    ds_append(c, basin.name, stream, b"e")
    assert basin.tail(stream)["seq_num"] == 5
    assert s2.bodies(basin.records(stream, seq_num=0)) == ["a", "b", "c", "d", "e"]
    assert ds_read(c, basin.name, stream).content == b"abcde"


def test_binary_durable_streams_append_reads_back_in_base64(c, basin, stream):
    ds_append(c, basin.name, stream, b"\xff\x00\xfe")
    [got] = basin.records(stream, fmt="base64", seq_num=0)
    assert unb64(got["body"]) == b"\xff\x00\xfe"


def test_stream_created_on_durable_streams_is_appendable_through_s2(c, basin):
    ds_create(c, basin.name, "ds-made", OCTET, body=b"initial")
    ack = basin.ack("ds-made", ["+s2"])
    assert ack["start"]["seq_num"] == 1
    assert ds_read(c, basin.name, "ds-made").content == b"initial+s2"
    assert s2.bodies(basin.records("ds-made", seq_num=0)) == ["initial", "+s2"]


def test_stream_created_on_durable_streams_takes_the_basins_default_stream_config(c):
    b = s2.Basin.create(c, config={"default_stream_config": {
        "retention_policy": {"age": 3600}, "storage_class": "express"}})
    ds_create(c, b.name, "ds-made", s2.TEXT)
    config = b.stream_config("ds-made")
    assert config["retention_policy"] == {"age": 3600}, config
    assert config["storage_class"] == "express", config


def test_fork_on_durable_streams_takes_the_basins_default_stream_config(c):
    b = s2.Basin.create(c, config={"default_stream_config": {"retention_policy": {"age": 60}}})
    ds_create(c, b.name, "source", s2.TEXT, body="x")
    r = c.put(ds_path(b.name, "fork"), headers={"content-type": s2.TEXT,
                                               "stream-forked-from": ds_path(b.name, "source")})
    check(r, 201)
    assert b.stream_config("fork")["retention_policy"] == {"age": 60}


def test_text_stream_created_on_durable_streams_reads_through_s2(c, basin):
    ds_create(c, basin.name, "text", s2.TEXT, body="line one\n")
    ds_append(c, basin.name, "text", "line two\n", s2.TEXT)
    got = basin.records("text", seq_num=0)
    assert s2.bodies(got) == ["line one\n", "line two\n"]
    assert all("headers" not in r for r in got)


def test_durable_streams_next_offset_counts_s2_records_and_bytes(c, basin, stream):
    basin.ack(stream, ["ab", "cde"])
    basin.ack(stream, [fence("t")])
    assert ds_head(c, basin.name, stream).headers["stream-next-offset"] == \
        "0000000000000003_0000000000000005"


def test_oddly_named_s2_stream_is_the_percent_encoded_durable_streams_path(c, basin):
    name = "a b%c+é"
    basin.create_stream(name)
    basin.ack(name, ["odd"])
    assert ds_read(c, basin.name, name).content == b"odd"


# --- live across faces -------------------------------------------------------------------------

def test_s2_sse_session_sees_a_durable_streams_append(c, basin, stream):
    with basin.sse(stream, seq_num=0) as s:
        s.expect_ok().until_ping()
        ds_append(c, basin.name, stream, b"from ds")
        events = s.until(lambda e: e.type == "batch")
    assert s2.bodies(events[-1].json()["records"]) == ["from ds"]


def test_durable_streams_long_poll_sees_an_s2_append(server, c, basin, stream):
    basin.ack(stream, ["before"])
    offset = ds_head(c, basin.name, stream).headers["stream-next-offset"]

    def poll():
        with server.client() as other:
            return other.get(ds_path(basin.name, stream),
                             params={"offset": offset, "live": "long-poll"})

    reader = Background(poll)
    basin.ack(stream, ["after"])
    r = check(reader.result(), 200)
    assert r.content == b"after"


def test_a_durable_streams_long_poll_woken_by_a_command_record_is_204_past_it(server, c, basin,
                                                                              stream):
    basin.ack(stream, ["before"])
    offset = ds_head(c, basin.name, stream).headers["stream-next-offset"]

    def poll():
        # Polled again when it times out before the fence arrives (the harness's long-polls
        # last 500 ms): what matters is what the poll the fence ends gets.
        with server.client() as other:
            while True:
                r = other.get(ds_path(basin.name, stream),
                              params={"offset": offset, "live": "long-poll"})
                if r.status_code != 204 or r.headers["stream-next-offset"] != offset:
                    return r

    reader = Background(poll)
    # Appended while the poll waits, so the fence is what wakes it.
    deadline = time.monotonic() + s2.WAIT_S
    while live_readers(c) < 1:
        assert time.monotonic() < deadline, "the long-poll never began waiting"
    basin.ack(stream, [fence("f")])
    r = check(reader.result(), 204)
    assert r.content == b""
    after = ds_head(c, basin.name, stream).headers["stream-next-offset"]
    assert after != offset
    assert r.headers["stream-next-offset"] == after


def live_readers(c):
    """`runnel_live_readers` from /metrics."""
    for line in c.get("/metrics").text.splitlines():
        if line.startswith("runnel_live_readers "):
            return float(line.split()[1])
    raise AssertionError("no runnel_live_readers in /metrics")


def sse_events(lines):
    """(event type, data lines joined) for each event of a Durable Streams SSE body."""
    kind, data = None, []
    for line in lines:
        if line == "":
            if kind is not None:
                yield kind, "\n".join(data)
            kind, data = None, []
        elif line.startswith("event:"):
            kind = line[len("event:"):].strip()
        elif line.startswith("data:"):
            data.append(line[len("data:"):])


def test_a_durable_streams_sse_reader_gets_no_empty_data_event_for_a_command_record(
        c, basin, stream):
    basin.ack(stream, ["before"])
    offset = ds_head(c, basin.name, stream).headers["stream-next-offset"]
    seen = []
    with c.stream("GET", ds_path(basin.name, stream),
                  params={"offset": offset, "live": "sse"}) as r:
        check(r, 200)
        events = sse_events(r.iter_lines())
        fenced = False
        for kind, data in events:
            seen.append((kind, data))
            if kind == "control" and not fenced:
                basin.ack(stream, [fence("f")])
                fenced = True
            elif kind == "control" and json.loads(data)["streamNextOffset"] != offset:
                # Past the fence: it told the reader where it is now, and showed nothing.
                ds_append(c, basin.name, stream, b"after")
                break
        for kind, data in events:
            seen.append((kind, data))
            if kind == "data":
                break
    data = [unb64(d) for kind, d in seen if kind == "data"]
    assert data == [b"after"], seen


# --- JSON streams ----------------------------------------------------------------------------

def json_stream(c, basin, name="j", initial=None):
    ds_create(c, basin.name, name, JSON_CT, body=initial)
    return name


def test_s2_records_on_a_json_stream_become_json_records(c, basin):
    stream = json_stream(c, basin)
    ack = basin.ack(stream, ['{"a": 1}', "[1, 2]", '"text"', "42", "null"])
    assert ack["end"]["seq_num"] == 5
    r = ds_read(c, basin.name, stream)
    assert r.json() == [{"a": 1}, [1, 2], "text", 42, None]


@pytest.mark.parametrize("bad", ["{", "", "1 2", "[1,]", "{'a': 1}", "nul"])
def test_s2_record_that_is_not_one_json_value_is_422_invalid_on_a_json_stream(c, basin, bad):
    stream = json_stream(c, basin)
    r = basin.append(stream, ["1", bad], status=422)
    expect_error(r, 422, "invalid")
    assert basin.tail(stream)["seq_num"] == 0
    assert ds_read(c, basin.name, stream).json() == []


def test_s2_record_over_1_mib_once_its_json_is_normalised_is_422_invalid(c, basin):
    # Sent under the cap, stored over it: `1e9` is written out longer. Readers with a 1 MiB
    # byte limit could never get such a record.
    stream = json_stream(c, basin)
    body = "[" + ",".join(["1e9"] * 262_000) + "]"
    assert s2.metered(body) < 1 << 20
    r = basin.append(stream, [body], status=422)
    expect_error(r, 422, "invalid")
    assert basin.tail(stream)["seq_num"] == 0


def test_s2_reads_of_a_json_stream_return_normalised_json_text(c, basin):
    stream = json_stream(c, basin)
    texts = ['{ "b" : 1 ,\n "a" : [ 1 , 2 ] }', " 7 ", '"x"']
    basin.ack(stream, texts)
    got = basin.records(stream, seq_num=0)
    lines = ndjson_lines(check(c.get(ds_path(basin.name, stream), params={"record": "0"}), 200))
    assert [r["body"].encode() for r in got] == lines
    assert [json.loads(r["body"]) for r in got] == [json.loads(t) for t in texts]
    assert all(" " not in r["body"] and "\n" not in r["body"] for r in got)


def test_durable_streams_json_values_are_one_s2_record_each(c, basin):
    stream = json_stream(c, basin, initial=[{"first": True}])
    ds_append(c, basin.name, stream, [1, {"two": 2}], JSON_CT)
    got = basin.records(stream, seq_num=0)
    assert s2.seq_nums(got) == [0, 1, 2]
    assert [json.loads(r["body"]) for r in got] == [{"first": True}, 1, {"two": 2}]
    assert all("headers" not in r for r in got)


def test_s2_seq_num_is_the_durable_streams_record_ordinal(c, basin):
    stream = json_stream(c, basin, initial=["ds0", "ds1"])
    ack = basin.ack(stream, ['"s2-2"', '"s2-3"', '"s2-4"'])
    assert ack["start"]["seq_num"] == 2
    for n in range(5):
        lines = ndjson_lines(check(c.get(ds_path(basin.name, stream), params={"record": str(n)}),
                                   200))
        expected = [r["body"].encode() for r in basin.records(stream, seq_num=n)]
        assert lines == expected, f"record={n}"


def test_command_records_are_422_on_a_json_stream_so_record_ordinals_stay_consecutive(c, basin):
    stream = json_stream(c, basin, initial=["ds0"])
    expect_error(basin.append(stream, [fence("tok")], status=422), 422, "invalid")
    expect_error(basin.append(stream, [b64('"x"'), s2.trim_b64(0)], fmt="base64", status=422), 422,
                 "invalid")
    assert basin.tail(stream)["seq_num"] == 1, "nothing of either batch was written"
    basin.ack(stream, ['"s2-1"'])
    r = check(c.get(ds_path(basin.name, stream), params={"record": "1"}), 200)
    assert r.headers["stream-record-start"] == "1"
    assert ndjson_lines(r) == [b'"s2-1"']


def test_s2_headers_on_json_records_are_invisible_to_durable_streams(c, basin):
    stream = json_stream(c, basin)
    basin.ack(stream, [rec('{"v": 1}', headers=[["meta", "data"]])])
    assert ds_read(c, basin.name, stream).json() == [{"v": 1}]
    assert basin.records(stream, seq_num=0)[0]["headers"] == [["meta", "data"]]


def test_a_durable_streams_record_larger_than_an_s2_read_step_is_still_read(c, basin, stream):
    big = b"x" * ((1 << 20) + 1000)  # more than one S2 read returns at once
    ds_append(c, basin.name, stream, big)
    ds_append(c, basin.name, stream, b"after")
    got = basin.records(stream, seq_num=0)
    assert s2.seq_nums(got) == [0], "the large record alone"
    assert len(got[0]["body"]) == len(big)
    with basin.sse(stream, seq_num=0, count=2) as s:
        events = s.expect_ok().rest()
    assert events[-1].done
    assert s2.seq_nums(s2.batch_records(events)) == [0, 1]


def test_a_close_through_durable_streams_leaves_the_s2_tail_timestamp_at_the_last_record(
        c, basin, stream):
    ack = basin.ack(stream, [rec("last", timestamp=1_000)])
    before = basin.tail(stream)
    assert before["timestamp"] == ack["end"]["timestamp"]
    check(c.post(ds_path(basin.name, stream), headers={"Stream-Closed": "true"}), 204)
    after = basin.tail(stream)
    assert after == before, "a close adds no record, so the tail's timestamp stays"
    expect_error(basin.append(stream, ["more"], status=422), 422, "invalid")
