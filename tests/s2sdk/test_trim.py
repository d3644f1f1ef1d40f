"""Trim: the trim command record (CommandRecord.trim: one header with an
empty name and value `trim`, an 8-byte big-endian seq_num as body) takes a
seq_num, and afterwards reads from before the trim point start at it. S2
trims eventually ("trimmed records may be visible for a brief period"), so the
tests wait, bounded, for the effect."""

from s2_sdk import CommandRecord, ReadLimit, SeqNum

from sdklib import append, eventually, read, read_all, seq_nums, within


async def first_seq_num(stream):
    got = await read(stream, start=SeqNum(0), limit=ReadLimit(count=1))
    return got.records[0].seq_num if got.records else None


async def test_reads_start_at_the_trim_point_after_a_trim(stream):
    await append(stream, *[f"r{i}" for i in range(10)])
    ack = await append(stream, CommandRecord.trim(6))
    assert (ack.start.seq_num, ack.end.seq_num) == (10, 11)

    async def trimmed():
        return await first_seq_num(stream) == 6

    await eventually(trimmed, what="reads from 0 start at the trim point 6")
    assert seq_nums(await read_all(stream)) == [6, 7, 8, 9, 10]
    assert (await within(stream.check_tail())).seq_num == 11


async def test_trim_record_takes_a_seq_num_and_reads_back_as_a_command(stream):
    await append(stream, b"a", b"b")
    await append(stream, CommandRecord.trim(1))
    got = (await read(stream, start=SeqNum(2))).records
    assert [r.seq_num for r in got] == [2]
    assert got[0].is_command_record()
    assert got[0].headers == [(b"", b"trim")]
    assert got[0].body == (1).to_bytes(8, "big")


async def test_trim_below_the_first_record_changes_nothing(stream):
    await append(stream, *[f"r{i}" for i in range(5)])
    await append(stream, CommandRecord.trim(3))

    async def trimmed():
        return await first_seq_num(stream) == 3

    await eventually(trimmed, what="first trim took effect")
    await append(stream, CommandRecord.trim(1))
    await append(stream, b"after")
    assert seq_nums(await read_all(stream)) == [3, 4, 5, 6, 7]
