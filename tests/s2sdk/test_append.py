"""Unary appends (S2Stream.append: POST .../records with an
application/x-protobuf AppendInput, protobuf AppendAck back): ack positions,
batches, record headers and bytes bodies as sent (non-UTF-8 too), timestamps
(client-prefer, arrival, monotonic), the batch limits at their edges (1000
records, 1 MiB metered), concurrent appends multiplexed on one HTTP/2
connection, and compressed request / response bodies."""

import asyncio

import pytest
from s2_sdk import (Compression, Record, SeqNum, StreamConfig, Timestamping,
                    TimestampingMode)

from sdklib import (MIB, append, batch, bodies, metered, now_ms, read, read_all, rec, seq_nums,
                    unique_basin, unique_stream, within)


async def test_single_record_ack_has_start_end_and_tail(stream):
    ack = await append(stream, b"hello")
    assert (ack.start.seq_num, ack.end.seq_num, ack.tail.seq_num) == (0, 1, 1)
    assert ack.start.timestamp == ack.end.timestamp == ack.tail.timestamp > 0
    got = await read(stream, start=SeqNum(0))
    assert seq_nums(got.records) == [0]
    assert bodies(got.records) == [b"hello"]
    assert got.records[0].timestamp == ack.start.timestamp


async def test_batch_gets_consecutive_seq_nums_and_the_next_append_continues(stream):
    ack = await append(stream, b"a", b"b", b"c")
    assert (ack.start.seq_num, ack.end.seq_num, ack.tail.seq_num) == (0, 3, 3)
    ack = await append(stream, b"d", b"e")
    assert (ack.start.seq_num, ack.end.seq_num, ack.tail.seq_num) == (3, 5, 5)
    records = await read_all(stream)
    assert seq_nums(records) == [0, 1, 2, 3, 4]
    assert bodies(records) == [b"a", b"b", b"c", b"d", b"e"]


async def test_headers_round_trip_in_order_with_duplicates_and_binary_bytes(stream):
    headers = [(b"a", b"1"), (b"b", b"two"), (b"a", b"3"), (b"empty-value", b""),
               (b"\xff\x00bin", b"\x00\x01\xfe\xff")]
    await append(stream, Record(body=b"with headers", headers=headers))
    [got] = (await read(stream, start=SeqNum(0))).records
    assert got.headers == headers
    assert got.body == b"with headers"


async def test_non_utf8_and_empty_bodies_round_trip_byte_for_byte(stream):
    every_byte = bytes(range(256))
    sent = [every_byte, b"", b"\x00", b"\xc3\x28 invalid utf-8", b"\xf0\x9f\x92\xa9 valid"]
    await append(stream, *sent)
    got = await read(stream, start=SeqNum(0))
    assert bodies(got.records) == sent
    assert all(r.headers == [] for r in got.records)


async def test_client_timestamps_are_kept_under_client_prefer(stream):
    ack = await append(stream, rec("a", timestamp=1000), rec("b", timestamp=1500),
                       rec("c", timestamp=2000))
    assert (ack.start.timestamp, ack.end.timestamp, ack.tail.timestamp) == (1000, 2000, 2000)
    got = await read(stream, start=SeqNum(0))
    assert [r.timestamp for r in got.records] == [1000, 1500, 2000]
    assert (await within(stream.check_tail())).timestamp == 2000


async def test_timestamps_never_go_backwards(stream):
    await append(stream, rec("a", timestamp=5000))
    ack = await append(stream, rec("b", timestamp=4000), rec("c", timestamp=6000))
    got = await read(stream, start=SeqNum(0))
    assert [r.timestamp for r in got.records] == [5000, 5000, 6000]
    assert ack.start.timestamp == 5000


async def test_records_without_a_timestamp_get_the_arrival_time(stream):
    before = now_ms()
    ack = await append(stream, b"x")
    after = now_ms()
    assert before - 1000 <= ack.start.timestamp <= after + 1000


async def test_arrival_mode_ignores_client_timestamps(basin):
    name = unique_stream()
    await within(basin.create_stream(name, config=StreamConfig(
        timestamping=Timestamping(mode=TimestampingMode.ARRIVAL))))
    before = now_ms()
    ack = await append(basin.stream(name), rec("x", timestamp=42))
    assert ack.start.timestamp >= before - 1000


async def test_future_timestamps_are_capped_at_arrival_unless_uncapped(basin, stream):
    future = now_ms() + 3_600_000
    ack = await append(stream, rec("capped", timestamp=future))
    assert ack.start.timestamp < future - 3_000_000
    name = unique_stream()
    await within(basin.create_stream(name, config=StreamConfig(
        timestamping=Timestamping(uncapped=True))))
    ack = await append(basin.stream(name), rec("uncapped", timestamp=future))
    assert ack.start.timestamp == future


async def test_a_batch_of_1000_records_is_accepted(stream):
    ack = await append(stream, *[f"r{i}" for i in range(1000)])
    assert (ack.start.seq_num, ack.end.seq_num) == (0, 1000)
    records = await read_all(stream)
    assert seq_nums(records) == list(range(1000))
    assert records[999].body == b"r999"


async def test_a_batch_of_exactly_1_mib_metered_is_accepted(stream):
    # Larger than the default HTTP/2 stream window (64 KiB) and s2-lite's
    # (1 MiB): the server must hand out flow-control credit while reading.
    body = bytes(i % 251 for i in range(MIB - 8))
    assert metered([Record(body=body)]) == MIB
    ack = await append(stream, body)
    assert ack.end.seq_num == 1
    [got] = (await read(stream, start=SeqNum(0))).records
    assert got.body == body


async def test_concurrent_appends_on_one_connection_get_disjoint_ranges(stream):
    acks = await within(asyncio.gather(*[
        stream.append(batch(f"{i}-0", f"{i}-1")) for i in range(30)]))
    ranges = sorted((a.start.seq_num, a.end.seq_num) for a in acks)
    assert ranges == [(s, s + 2) for s in range(0, 60, 2)]
    records = await read_all(stream)
    assert seq_nums(records) == list(range(60))
    for i in range(0, 60, 2):
        first, second = records[i].body, records[i + 1].body
        assert first.endswith(b"-0") and second == first[:-1] + b"1"


@pytest.mark.parametrize("compression", [Compression.ZSTD, Compression.GZIP],
                         ids=["zstd", "gzip"])
async def test_compressed_requests_and_responses(new_client, compression):
    """With compression on, the SDK sends `accept-encoding` on every request and
    compresses every request body (JSON control plane and protobuf appends
    alike) with `content-encoding`; responses may come back compressed."""
    s2 = new_client(compression=compression)
    name = unique_basin()
    await within(s2.create_basin(name))
    try:
        b = s2.basin(name)
        await within(b.create_stream("z"))
        s = b.stream("z")
        big = (b"compressible " * 1000)[:12000]
        ack = await append(s, b"small", big, rec(big, headers=[("h", "v" * 2000)]))
        assert ack.end.seq_num == 3
        got = await read(s, start=SeqNum(0))
        assert bodies(got.records) == [b"small", big, big]
        assert got.records[2].headers == [(b"h", b"v" * 2000)]
        assert (await within(s.check_tail())).seq_num == 3
    finally:
        await within(s2.delete_basin(name, ignore_not_found=True))
