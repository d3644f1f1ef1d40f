"""S2's exact metered size, 8 + 2*headers + sum(name + value bytes) + body
bytes, as seen through the `bytes` read limit and the SSE `id` byte counts
(the append-side 1 MiB limits are in test_append.py, commands in
test_commands.py)."""

import pytest

import s2lib as s2
from s2lib import b64, batches, event_id, metered, rec

CASES = {
    "empty": rec(),
    "body_only": rec("hello"),
    "one_header": rec("xyz", headers=[["ab", "cde"]]),
    "two_headers_one_empty_value": rec("xyz", headers=[["ab", "cde"], ["f", ""]]),
    "multibyte_utf8": rec("é✓", headers=[["ключ", "значение"]]),
}


def size_of(r):
    return metered(r.get("body", ""), r.get("headers", []))


@pytest.mark.parametrize("case", list(CASES))
def test_bytes_limit_admits_a_record_exactly_at_its_metered_size(basin, stream, case):
    record = CASES[case]
    basin.ack(stream, [record, "next"])
    size = size_of(record)
    if size > 0:
        assert basin.records(stream, seq_num=0, bytes=size - 1) == []
    assert s2.seq_nums(basin.records(stream, seq_num=0, bytes=size)) == [0]
    assert s2.seq_nums(basin.records(stream, seq_num=0, bytes=size + metered("next"))) == [0, 1]


def test_known_sizes():
    assert size_of(CASES["empty"]) == 8
    assert size_of(CASES["body_only"]) == 13
    assert size_of(CASES["two_headers_one_empty_value"]) == 8 + 4 + 6 + 3
    assert size_of(CASES["multibyte_utf8"]) == 8 + 2 + 8 + 16 + 5


def test_base64_records_are_metered_by_decoded_length(basin, stream):
    basin.ack(stream, [rec(b64(b"\x00" * 10), headers=[[b64(b"\xff"), b64(b"\x01\x02")]])],
              fmt="base64")
    basin.ack(stream, ["x"])
    size = 8 + 2 + 1 + 2 + 10
    assert basin.records(stream, seq_num=0, bytes=size - 1) == []
    assert s2.seq_nums(basin.records(stream, seq_num=0, bytes=size)) == [0]


def test_sse_ids_count_metered_bytes_of_every_record(basin, stream):
    records = list(CASES.values())
    basin.ack(stream, records)
    with basin.sse(stream, seq_num=0, count=len(records)) as s:
        events = s.expect_ok().rest()
    assert events[-1].done
    total = sum(size_of(r) for r in records)
    assert event_id(batches(events)[-1]) == (len(records) - 1, len(records), total)
