"""Appends (POST /v1/streams/{stream}/records): the AppendAck, records and
headers as sent, `s2-format`, `match_seq_num` and its 412 body, batch limits
(1..=1000 records, 1 MiB metered per batch and per record), and the error
codes for bad JSON (400 bad_json) and bad records (422 invalid)."""

import json
import threading

import pytest

import s2lib as s2
from s2lib import MIB, b64, check, expect_error, json_of, metered, rec, unb64


# --- the ack ----------------------------------------------------------------------

def test_ack_has_start_end_and_tail_positions(basin, stream):
    ack = basin.ack(stream, ["a", "b", "c"])
    assert ack["start"]["seq_num"] == 0
    assert ack["end"]["seq_num"] == 3
    assert ack["tail"]["seq_num"] == 3
    ack = basin.ack(stream, ["d"])
    assert (ack["start"]["seq_num"], ack["end"]["seq_num"], ack["tail"]["seq_num"]) == (3, 4, 4)


def test_ack_timestamps_are_first_and_last_record_timestamps(basin, stream):
    ack = basin.ack(stream, [rec("a", timestamp=1000), rec("b", timestamp=1500),
                             rec("c", timestamp=2000)])
    assert ack["start"]["timestamp"] == 1000
    assert ack["end"]["timestamp"] == 2000
    assert ack["tail"] == {"seq_num": 3, "timestamp": 2000}


def test_check_tail_reports_next_seq_num_and_last_timestamp(basin, stream):
    basin.ack(stream, [rec("a", timestamp=10), rec("b", timestamp=20)])
    assert basin.tail(stream) == {"seq_num": 2, "timestamp": 20}


def test_concurrent_appends_get_disjoint_consecutive_ranges(server, basin, stream):
    acks, lock = [], threading.Lock()

    def worker(i):
        with server.client() as c:
            b = s2.Basin(c, basin.name)
            for j in range(5):
                ack = b.ack(stream, [f"{i}-{j}-0", f"{i}-{j}-1"])
                with lock:
                    acks.append(ack)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(s2.WAIT_S * 3)
    assert len(acks) == 30
    ranges = sorted((a["start"]["seq_num"], a["end"]["seq_num"]) for a in acks)
    assert all(end - start == 2 for start, end in ranges)
    assert [s for s, _ in ranges] == list(range(0, 60, 2))
    records = basin.all_records(stream)
    assert s2.seq_nums(records) == list(range(60))
    by_start = {a["start"]["seq_num"]: a for a in acks}
    for start in by_start:
        first, second = records[start]["body"], records[start + 1]["body"]
        assert first.endswith("-0") and second == first[:-1] + "1"


# --- records as sent ----------------------------------------------------------------

def test_headers_round_trip_in_order_with_duplicates(basin, stream):
    headers = [["a", "1"], ["b", "two"], ["a", "3"], ["empty-value", ""]]
    basin.ack(stream, [rec("body", headers=headers)])
    [got] = basin.records(stream, seq_num=0)
    assert got["headers"] == headers
    assert got["body"] == "body"


def test_record_without_body_or_headers_reads_back_with_neither(basin, stream):
    basin.ack(stream, [{}])
    [got] = basin.records(stream, seq_num=0)
    assert set(got) == {"seq_num", "timestamp"}, got


def test_record_with_empty_body_and_headers_omits_the_body(basin, stream):
    basin.ack(stream, [rec("", headers=[["k", "v"]])])
    [got] = basin.records(stream, seq_num=0)
    assert set(got) == {"seq_num", "timestamp", "headers"}, got
    assert got["headers"] == [["k", "v"]]


def test_raw_format_stores_utf8_text(c, basin, stream):
    text = "héllo ✓ \u0000 end"
    basin.ack(stream, [text])
    assert basin.records(stream, seq_num=0)[0]["body"] == text
    assert s2.ds_read(c, basin.name, stream).content == text.encode()


# --- s2-format --------------------------------------------------------------------

ALL_BYTES = bytes(range(256))


def test_base64_format_round_trips_binary_bodies_and_headers(c, basin, stream):
    basin.ack(stream, [rec(b64(ALL_BYTES), headers=[[b64(b"\x00\xffname"), b64(b"\x80value")]])],
              fmt="base64")
    [got] = basin.records(stream, fmt="base64", seq_num=0)
    assert unb64(got["body"]) == ALL_BYTES
    assert [[unb64(n), unb64(v)] for n, v in got["headers"]] == [[b"\x00\xffname", b"\x80value"]]
    assert s2.ds_read(c, basin.name, stream).content == ALL_BYTES


def test_raw_read_of_non_utf8_bytes_is_lossy_utf8(basin, stream):
    basin.ack(stream, [rec(b64(b"ok\xff\xfe!"))], fmt="base64")
    [got] = basin.records(stream, fmt="raw", seq_num=0)
    assert got["body"] == "ok\ufffd\ufffd!"


@pytest.mark.parametrize("alias,canonical", [("json", "raw"), ("json-binsafe", "base64")])
def test_s2_format_aliases(basin, stream, alias, canonical):
    body = b64("aliased") if canonical == "base64" else "aliased"
    basin.ack(stream, [body], fmt=alias)
    [got] = basin.records(stream, fmt=alias, seq_num=0)
    assert got["body"] == body
    assert basin.records(stream, seq_num=0)[0]["body"] == "aliased"


@pytest.mark.parametrize("bad", ["not base64!", "YWJj=", "YW Jj", "YWJ"])
def test_invalid_base64_is_422_invalid(basin, stream, bad):
    expect_error(basin.append(stream, [bad], status=422, fmt="base64"), 422, "invalid")
    assert basin.tail(stream)["seq_num"] == 0


def test_invalid_base64_header_is_422_invalid(basin, stream):
    r = basin.append(stream, [rec(b64("x"), headers=[["!!", b64("v")]])], status=422,
                     fmt="base64")
    expect_error(r, 422, "invalid")


@pytest.mark.parametrize("fmt", ["hex", "BASE64", ""])
def test_unknown_s2_format_is_400_bad_header(basin, stream, fmt):
    expect_error(basin.append(stream, ["x"], status=400, fmt=fmt), 400, "bad_header")
    expect_error(basin.read(stream, status=400, fmt=fmt, seq_num=0), 400, "bad_header")


# --- match_seq_num ------------------------------------------------------------------

def test_match_seq_num_equal_to_the_tail_appends(basin, stream):
    assert basin.ack(stream, ["a"], match_seq_num=0)["start"]["seq_num"] == 0
    assert basin.ack(stream, ["b", "c"], match_seq_num=1)["end"]["seq_num"] == 3


@pytest.mark.parametrize("wrong", [0, 1, 3, 100])
def test_match_seq_num_mismatch_is_412_with_the_next_seq_num(basin, stream, wrong):
    basin.ack(stream, ["a", "b"])
    r = basin.append(stream, ["c"], status=412, match_seq_num=wrong)
    assert json_of(r, 412) == {"seq_num_mismatch": 2}
    assert basin.tail(stream)["seq_num"] == 2


def test_null_match_seq_num_and_fencing_token_are_no_conditions(basin, stream):
    basin.ack(stream, ["a"])
    assert basin.ack(stream, ["b"], match_seq_num=None, fencing_token=None)["start"]["seq_num"] == 1


# --- limits -------------------------------------------------------------------------

def test_batch_of_1000_records_is_accepted(basin, stream):
    ack = basin.ack(stream, [str(i) for i in range(1000)])
    assert (ack["start"]["seq_num"], ack["end"]["seq_num"]) == (0, 1000)


def test_batch_of_1001_records_is_422_invalid(basin, stream):
    r = basin.append(stream, [str(i) for i in range(1001)], status=422)
    expect_error(r, 422, "invalid")
    assert basin.tail(stream)["seq_num"] == 0


def test_empty_batch_is_422_invalid(basin, stream):
    expect_error(basin.append(stream, [], status=422), 422, "invalid")


def test_record_of_exactly_1_mib_metered_is_accepted(basin, stream):
    headers = [["h", "v"], ["name", "value"]]
    body = "x" * (MIB - metered("", headers))
    assert metered(body, headers) == MIB
    basin.ack(stream, [rec(body, headers=headers)])
    [got] = basin.records(stream, seq_num=0)
    assert len(got["body"]) == len(body)


def test_record_one_byte_over_1_mib_metered_is_422_invalid(basin, stream):
    headers = [["h", "v"], ["name", "value"]]
    body = "x" * (MIB - metered("", headers) + 1)
    expect_error(basin.append(stream, [rec(body, headers=headers)], status=422), 422, "invalid")
    assert basin.tail(stream)["seq_num"] == 0


def test_record_size_counts_utf8_bytes_not_characters(basin, stream):
    body = "é" * ((MIB - 8) // 2)
    assert metered(body) == MIB
    basin.ack(stream, [body])
    expect_error(basin.append(stream, [body + "a"], status=422), 422, "invalid")


def test_batch_of_exactly_1_mib_metered_is_accepted(basin, stream):
    first = "a" * 1000
    second = "b" * (MIB - metered(first) - metered(""))
    assert metered(first) + metered(second) == MIB
    ack = basin.ack(stream, [first, second])
    assert ack["end"]["seq_num"] == 2


def test_batch_one_byte_over_1_mib_metered_is_422_invalid(basin, stream):
    first = "a" * 1000
    second = "b" * (MIB - metered(first) - metered("") + 1)
    expect_error(basin.append(stream, [first, second], status=422), 422, "invalid")
    assert basin.tail(stream)["seq_num"] == 0


def test_base64_limit_counts_decoded_bytes(basin, stream):
    body = b"\x01" * (MIB - 8)
    basin.ack(stream, [b64(body)], fmt="base64")
    expect_error(basin.append(stream, [b64(body + b"\x02")], status=422, fmt="base64"),
                 422, "invalid")


# --- bad requests -------------------------------------------------------------------

BAD_JSON_BODIES = {
    "syntax": "{\"records\": [",
    "not_an_object": "[]",
    "records_missing": "{}",
    "records_not_an_array": '{"records": {"body": "x"}}',
    "body_not_a_string": '{"records": [{"body": 5}]}',
    "header_not_a_pair": '{"records": [{"headers": [["only-name"]]}]}',
    "header_triple": '{"records": [{"headers": [["a", "b", "c"]]}]}',
    "header_value_not_a_string": '{"records": [{"headers": [["a", 1]]}]}',
    "timestamp_negative": '{"records": [{"timestamp": -1}]}',
    "timestamp_string": '{"records": [{"timestamp": "now"}]}',
    "match_seq_num_string": '{"records": [{}], "match_seq_num": "0"}',
    "fencing_token_number": '{"records": [{}], "fencing_token": 7}',
}


@pytest.mark.parametrize("what", list(BAD_JSON_BODIES))
def test_malformed_append_body_is_400_bad_json(basin, stream, what):
    expect_error(basin.post(stream, BAD_JSON_BODIES[what]), 400, "bad_json")
    assert basin.tail(stream)["seq_num"] == 0


def test_append_without_content_type_is_400_bad_json(c, basin, stream):
    r = c.post(s2.records_path(stream), content=json.dumps({"records": [{"body": "x"}]}),
               headers=basin.headers())
    expect_error(r, 400, "bad_json")


def test_append_with_non_json_content_type_is_400_bad_json(c, basin, stream):
    r = c.post(s2.records_path(stream), content=json.dumps({"records": [{"body": "x"}]}),
               headers=basin.headers({"content-type": "text/plain"}))
    expect_error(r, 400, "bad_json")


@pytest.mark.parametrize("headers", [
    [["", "x"]],                      # empty name, unknown command
    [["", "fence"], ["a", "b"]],      # command header among others
    [["a", "b"], ["", "trim"]],
    [["", ""]],
])
def test_empty_header_name_outside_a_single_command_header_is_422_invalid(basin, stream, headers):
    expect_error(basin.append(stream, [rec("body", headers=headers)], status=422), 422, "invalid")
    assert basin.tail(stream)["seq_num"] == 0


def test_one_bad_record_rejects_the_whole_batch(basin, stream):
    r = basin.append(stream, ["fine", rec("bad", headers=[["", "nope"]]), "fine too"], status=422)
    expect_error(r, 422, "invalid")
    assert basin.tail(stream)["seq_num"] == 0
