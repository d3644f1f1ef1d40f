"""Read sessions (S2Stream.read_session: GET .../records with `content-type:
s2s/proto`, S2S-framed ReadBatches down, heartbeats = empty batches that carry
the tail): catch-up then end at a limit or at the tail, the caught-up signal,
live tailing of records appended after the session started, heartbeats that
keep an idle session alive past the SDK's 20 s silence timeout, `wait`,
clamp_to_tail, 416 / 404 at the start, several sessions multiplexed on one
HTTP/2 connection, and large / compressed frames."""

import asyncio

import pytest
from s2_sdk import (Compression, ReadLimit, ReadUnwrittenError, S2ServerError, SeqNum,
                    TailOffset, Timestamp)

from sdklib import (WAIT_S, append, bodies, drain, opened, rec, seq_nums, take, unique_basin,
                    within)

# The SDK drops (and, with retries off, fails) a read session that hears
# nothing for this long; server heartbeats must come more often.
SDK_HEARTBEAT_TIMEOUT_S = 20.0


async def test_session_replays_history_and_ends_at_its_count_limit(stream):
    await append(stream, *[f"r{i}" for i in range(10)])
    async with opened(stream.read_session(start=SeqNum(2), limit=ReadLimit(count=5))) as s:
        got = await drain(s)
    assert seq_nums(got) == [2, 3, 4, 5, 6]
    assert bodies(got) == [f"r{i}".encode() for i in range(2, 7)]


async def test_bounded_session_without_wait_ends_at_the_tail(stream):
    await append(stream, b"a", b"b", b"c")
    async with opened(stream.read_session(start=SeqNum(0), limit=ReadLimit(count=100))) as s:
        got = await drain(s)
    assert bodies(got) == [b"a", b"b", b"c"]


async def test_session_bytes_limit_and_until_timestamp(stream):
    await append(stream, *[rec(f"r{i}", timestamp=100 * (i + 1)) for i in range(6)])
    async with opened(stream.read_session(start=SeqNum(0), limit=ReadLimit(bytes=30))) as s:
        assert seq_nums(await drain(s)) == [0, 1, 2]
    async with opened(stream.read_session(start=SeqNum(0), until_timestamp=400)) as s:
        assert seq_nums(await drain(s)) == [0, 1, 2]


async def test_session_from_a_timestamp_and_from_a_tail_offset(stream):
    await append(stream, *[rec(f"r{i}", timestamp=100 * (i + 1)) for i in range(6)])
    async with opened(stream.read_session(start=Timestamp(350), limit=ReadLimit(count=10))) as s:
        assert seq_nums(await drain(s)) == [3, 4, 5]
    async with opened(stream.read_session(start=TailOffset(2), limit=ReadLimit(count=10))) as s:
        assert seq_nums(await drain(s)) == [4, 5]


async def test_caught_up_resolves_with_the_tail_once_history_is_delivered(stream):
    ack = await append(stream, *[f"h{i}" for i in range(20)])
    async with opened(stream.read_session(start=SeqNum(0))) as s:
        got = await take(s, 20)
        assert seq_nums(got) == list(range(20))
        # The server signals "caught up" promptly (a heartbeat, or a batch
        # whose tail is just past its last record), not only at the next
        # periodic heartbeat.
        tail = await within(s.caught_up(), timeout=5, what="caught-up signal")
        assert tail.seq_num == 20
        assert tail.timestamp == ack.tail.timestamp
        assert s.is_caught_up()


async def test_session_started_at_the_tail_receives_later_appends(stream):
    await append(stream, b"old")
    async with opened(stream.read_session(start=SeqNum(1))) as s:
        ack = await append(stream, b"new")
        [got] = await take(s, 1)
        assert (got.seq_num, got.body, got.timestamp) == (1, b"new", ack.start.timestamp)
        await append(stream, b"newer", b"newest")
        got = await take(s, 2)
        assert bodies(got) == [b"newer", b"newest"]
        assert seq_nums(got) == [2, 3]


async def test_tailing_session_sees_many_appends_in_order(stream):
    async with opened(stream.read_session(start=SeqNum(0))) as s:
        reader = asyncio.create_task(take(s, 100, timeout=3 * WAIT_S))
        for i in range(50):
            await append(stream, f"{i}a", f"{i}b")
        got = await within(reader, timeout=3 * WAIT_S)
    assert seq_nums(got) == list(range(100))
    assert bodies(got) == [f"{i}{x}".encode() for i in range(50) for x in "ab"]


async def test_tail_offset_zero_session_follows_the_live_tail(stream):
    await append(stream, b"before")
    async with opened(stream.read_session(start=TailOffset(0))) as s:
        await within(s.caught_up(), what="caught-up signal at the tail")
        await append(stream, b"after")
        [got] = await take(s, 1)
        assert (got.seq_num, got.body) == (1, b"after")


@pytest.mark.timeout(SDK_HEARTBEAT_TIMEOUT_S + 3 * WAIT_S)
async def test_heartbeats_keep_an_idle_tailing_session_alive(stream):
    """With retries off, a session that hears nothing (not even a heartbeat)
    for 20 s fails with a timeout; stay idle longer than that, then append."""
    await append(stream, b"a")
    async with opened(stream.read_session(start=SeqNum(1))) as s:
        await within(s.caught_up(), what="caught-up signal at the tail")
        # Deliberate idle period: the thing under test is what the server
        # sends while nothing happens.
        await asyncio.sleep(SDK_HEARTBEAT_TIMEOUT_S + 2)
        assert s.is_caught_up()
        ack = await append(stream, b"after the quiet")
        [got] = await take(s, 1)
        assert (got.seq_num, got.body) == (ack.start.seq_num, b"after the quiet")


async def test_session_with_wait_ends_after_that_much_idle_time(stream):
    await append(stream, b"a")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    async with opened(stream.read_session(start=SeqNum(0), wait=1)) as s:
        got = await drain(s, timeout=WAIT_S)
    assert bodies(got) == [b"a"]
    assert loop.time() - t0 >= 0.5


async def test_session_beyond_the_tail_is_416_unless_clamped(stream):
    await append(stream, b"a", b"b")
    async with opened(stream.read_session(start=SeqNum(10))) as s:
        with pytest.raises(ReadUnwrittenError) as err:
            await take(s, 1)
    assert err.value.tail.seq_num == 2
    async with opened(stream.read_session(start=SeqNum(10), clamp_to_tail=True)) as s:
        await within(s.caught_up(), what="caught-up signal at the tail")
        await append(stream, b"c")
        [got] = await take(s, 1)
        assert (got.seq_num, got.body) == (2, b"c")


async def test_session_on_a_missing_stream_is_404(basin):
    async with opened(basin.stream("nope").read_session(start=SeqNum(0))) as s:
        with pytest.raises(S2ServerError) as err:
            await take(s, 1)
    assert err.value.status_code == 404, vars(err.value)


async def test_several_tailing_sessions_share_one_connection(stream):
    sessions = [stream.read_session(start=SeqNum(0)) for _ in range(4)]
    try:
        await within(asyncio.gather(*[s.caught_up() for s in sessions]),
                     what="every session caught up")
        await append(stream, b"fan", b"out")
        results = await within(asyncio.gather(*[take(s, 2) for s in sessions]))
        for got in results:
            assert bodies(got) == [b"fan", b"out"]
    finally:
        for s in sessions:
            await within(s.close())


async def test_session_ignores_command_records_when_asked(stream):
    await append(stream, b"a", rec("t", headers=[("", "fence")]), b"b")
    async with opened(stream.read_session(start=SeqNum(0), limit=ReadLimit(count=3),
                                          ignore_command_records=True)) as s:
        got = await drain(s)
    assert bodies(got) == [b"a", b"b"]


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.ZSTD, Compression.GZIP],
                         ids=["plain", "zstd", "gzip"])
async def test_large_batches_in_a_session_with_and_without_compression(new_client, compression):
    s2 = new_client(compression=compression)
    name = unique_basin()
    await within(s2.create_basin(name))
    try:
        b = s2.basin(name)
        await within(b.create_stream("big"))
        s = b.stream("big")
        big = [bytes([i]) * 200_000 for i in range(12)]  # ~2.4 MB over several batches
        for i in range(0, 12, 4):
            await append(s, *big[i:i + 4])
        async with opened(s.read_session(start=SeqNum(0), limit=ReadLimit(count=12))) as rs:
            got = await drain(rs)
        assert bodies(got) == big
        async with opened(s.read_session(start=SeqNum(12))) as rs:
            await within(rs.caught_up(), what="caught-up signal at the tail")
            await append(s, b"x" * 5000)
            [live] = await take(rs, 1)
            assert live.body == b"x" * 5000
    finally:
        await within(s2.delete_basin(name, ignore_not_found=True))
