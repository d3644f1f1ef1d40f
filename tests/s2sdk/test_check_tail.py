"""Check-tail (S2Stream.check_tail: GET .../records/tail, JSON): the next
seq_num to be assigned and the timestamp of the last record; 0 / 0 on an
empty stream; command records move it like any record."""

from s2_sdk import CommandRecord

from sdklib import append, rec, within


async def test_an_empty_stream_has_tail_zero(stream):
    tail = await within(stream.check_tail())
    assert (tail.seq_num, tail.timestamp) == (0, 0)


async def test_tail_follows_appends_and_the_last_records_timestamp(stream):
    await append(stream, rec("a", timestamp=10), rec("b", timestamp=20))
    tail = await within(stream.check_tail())
    assert (tail.seq_num, tail.timestamp) == (2, 20)
    ack = await append(stream, b"c")
    tail = await within(stream.check_tail())
    assert tail.seq_num == 3
    assert tail.timestamp == ack.end.timestamp == ack.tail.timestamp


async def test_command_records_advance_the_tail(stream):
    await append(stream, b"a")
    await append(stream, CommandRecord.fence("f"))
    await append(stream, CommandRecord.trim(0))
    assert (await within(stream.check_tail())).seq_num == 3
