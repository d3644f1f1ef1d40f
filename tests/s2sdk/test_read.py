"""Unary reads (S2Stream.read: GET .../records with `accept:
application/x-protobuf`, a protobuf ReadBatch back): the three start
positions (seq_num, timestamp, tail_offset), the count / bytes / until
limits, 416 (ReadUnwrittenError carrying the tail) at or beyond the tail,
clamp_to_tail, the `wait` long poll, and ignore_command_records."""

import asyncio

import pytest
from s2_sdk import (ReadLimit, ReadUnwrittenError, SeqNum, TailOffset, Timestamp)

from sdklib import append, bodies, metered, read, rec, seq_nums, within


async def five(stream):
    """Appends r0..r4 with timestamps 1000, 1010, ..., 1040."""
    await append(stream, *[rec(f"r{i}", timestamp=1000 + 10 * i) for i in range(5)])


async def test_read_from_a_seq_num(stream):
    await five(stream)
    got = await read(stream, start=SeqNum(2))
    assert seq_nums(got.records) == [2, 3, 4]
    assert bodies(got.records) == [b"r2", b"r3", b"r4"]
    assert [r.timestamp for r in got.records] == [1020, 1030, 1040]


async def test_read_from_a_timestamp_starts_at_the_first_record_at_or_after_it(stream):
    await five(stream)
    assert seq_nums((await read(stream, start=Timestamp(1015))).records) == [2, 3, 4]
    assert seq_nums((await read(stream, start=Timestamp(1020))).records) == [2, 3, 4]
    assert seq_nums((await read(stream, start=Timestamp(0))).records) == [0, 1, 2, 3, 4]


async def test_read_from_a_tail_offset_saturates_at_the_start(stream):
    await five(stream)
    assert seq_nums((await read(stream, start=TailOffset(2))).records) == [3, 4]
    assert seq_nums((await read(stream, start=TailOffset(99))).records) == [0, 1, 2, 3, 4]


async def test_count_limit(stream):
    await five(stream)
    got = await read(stream, start=SeqNum(1), limit=ReadLimit(count=2))
    assert seq_nums(got.records) == [1, 2]
    got = await read(stream, start=SeqNum(0), limit=ReadLimit(count=0))
    assert got.records == []


async def test_bytes_limit_counts_metered_bytes_and_never_overshoots(stream):
    await five(stream)
    one = metered([rec("r0")])  # 8 + 2 = 10
    got = await read(stream, start=SeqNum(0), limit=ReadLimit(bytes=2 * one))
    assert seq_nums(got.records) == [0, 1]
    got = await read(stream, start=SeqNum(0), limit=ReadLimit(bytes=2 * one + one - 1))
    assert seq_nums(got.records) == [0, 1]
    got = await read(stream, start=SeqNum(0), limit=ReadLimit(bytes=one - 1))
    assert got.records == []


async def test_until_timestamp_is_exclusive(stream):
    await five(stream)
    got = await read(stream, start=SeqNum(0), until_timestamp=1020)
    assert seq_nums(got.records) == [0, 1]


async def test_read_at_the_tail_is_416_with_the_tail(stream):
    ack = await append(stream, b"a", b"b")
    with pytest.raises(ReadUnwrittenError) as err:
        await read(stream, start=SeqNum(2))
    assert err.value.status_code == 416
    assert err.value.tail.seq_num == 2
    assert err.value.tail.timestamp == ack.tail.timestamp


async def test_read_beyond_the_tail_is_416_and_an_empty_stream_is_at_its_tail(stream):
    with pytest.raises(ReadUnwrittenError) as err:
        await read(stream, start=SeqNum(0))
    assert err.value.tail.seq_num == 0
    await append(stream, b"a")
    with pytest.raises(ReadUnwrittenError) as err:
        await read(stream, start=SeqNum(7))
    assert err.value.tail.seq_num == 1
    with pytest.raises(ReadUnwrittenError):
        await read(stream, start=Timestamp(2**62))


async def test_clamp_to_tail_turns_a_start_beyond_the_tail_into_a_wait_at_the_tail(stream):
    await append(stream, b"a")
    with pytest.raises(ReadUnwrittenError):
        await read(stream, start=SeqNum(9), wait=1)
    got = await read(stream, start=SeqNum(9), clamp_to_tail=True, wait=1)
    assert got.records == []


async def test_wait_long_polls_for_the_next_append(stream):
    await append(stream, b"a")

    async def later():
        # A short head start so the read is usually parked at the tail when
        # the append lands (nothing signals that; if the append wins the race
        # the read simply returns the record at once and the test still holds).
        await asyncio.sleep(0.3)
        return await append(stream, b"late")

    task = asyncio.create_task(later())
    got = await read(stream, start=SeqNum(1), wait=5)
    ack = await within(task)
    assert bodies(got.records) == [b"late"]
    assert got.records[0].seq_num == ack.start.seq_num == 1


async def test_wait_expires_with_an_empty_batch(stream):
    await append(stream, b"a")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    got = await read(stream, start=SeqNum(1), wait=1)
    assert got.records == []
    assert loop.time() - t0 >= 0.5


async def test_ignore_command_records_leaves_out_fence_and_trim(stream):
    await append(stream, b"a", rec("tok", headers=[("", "fence")]), b"b")
    everything = await read(stream, start=SeqNum(0))
    assert seq_nums(everything.records) == [0, 1, 2]
    assert everything.records[1].is_command_record()
    got = await read(stream, start=SeqNum(0), ignore_command_records=True)
    assert bodies(got.records) == [b"a", b"b"]
    assert seq_nums(got.records) == [0, 2]
