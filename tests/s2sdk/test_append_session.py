"""Append sessions (S2Stream.append_session and S2Stream.producer: one
long-lived POST .../records with `content-type: s2s/proto`, S2S-framed
AppendInputs up, S2S-framed AppendAcks down): pipelined batches acked in
submission order with consecutive ranges, many batches in one session,
backpressure, large and compressed frames, the Producer's per-record acks,
and errors delivered as terminal frames (or as the HTTP status when the
session cannot start)."""

import asyncio

import pytest
from s2_sdk import (Batching, Compression, FencingTokenMismatchError, S2ServerError,
                    SeqNumMismatchError)

from sdklib import (MIB, WAIT_S, append, batch, bodies, opened, read_all, rec, seq_nums,
                    unique_basin, within)


async def test_pipelined_batches_are_acked_in_order_with_consecutive_ranges(stream):
    async with opened(stream.append_session()) as session:
        tickets = [await within(session.submit(batch(*[f"{i}.{j}" for j in range(i + 1)])))
                   for i in range(10)]
        acks = [await within(t, what=f"ack {i}") for i, t in enumerate(tickets)]
    start = 0
    for i, ack in enumerate(acks):
        assert (ack.start.seq_num, ack.end.seq_num) == (start, start + i + 1)
        assert ack.tail.seq_num >= ack.end.seq_num
        start += i + 1
    records = await read_all(stream)
    assert seq_nums(records) == list(range(55))
    assert bodies(records) == [f"{i}.{j}".encode() for i in range(10) for j in range(i + 1)]


async def test_many_batches_in_one_session_all_land_in_order(stream):
    n = 300
    async with opened(stream.append_session()) as session:
        tickets = [await within(session.submit(batch(f"b{i}-0", f"b{i}-1", f"b{i}-2")))
                   for i in range(n)]
        acks = await within(asyncio.gather(*[_await(t) for t in tickets]), timeout=3 * WAIT_S)
    assert [a.start.seq_num for a in acks] == list(range(0, 3 * n, 3))
    assert acks[-1].end.seq_num == 3 * n
    records = await read_all(stream)
    assert len(records) == 3 * n
    assert bodies(records[-3:]) == [f"b{n - 1}-{j}".encode() for j in range(3)]


async def _await(ticket):
    return await ticket


async def test_session_with_one_unacked_batch_at_a_time_still_completes(stream):
    async with opened(stream.append_session(max_unacked_batches=1)) as session:
        tickets = [await within(session.submit(batch(f"{i}"))) for i in range(20)]
    acks = [await within(t) for t in tickets]
    assert [a.start.seq_num for a in acks] == list(range(20))
    assert bodies(await read_all(stream)) == [f"{i}".encode() for i in range(20)]


async def test_session_acks_and_unary_appends_interleave_on_one_stream(stream):
    async with opened(stream.append_session()) as session:
        first = await within(session.submit(batch("s0")))
        assert (await within(first)).end.seq_num == 1
        ack = await append(stream, b"u1")
        assert ack.start.seq_num == 1
        second = await within(session.submit(batch("s2")))
        assert (await within(second)).start.seq_num == 2
    assert bodies(await read_all(stream)) == [b"s0", b"u1", b"s2"]


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.ZSTD, Compression.GZIP],
                         ids=["plain", "zstd", "gzip"])
async def test_large_frames_with_and_without_compression(new_client, compression):
    """Frames of 1 KiB or more go compressed (flag bits CC) when the client
    asks for compression; near-1 MiB batches need HTTP/2 flow control both ways."""
    s2 = new_client(compression=compression)
    name = unique_basin()
    await within(s2.create_basin(name))
    try:
        b = s2.basin(name)
        await within(b.create_stream("big"))
        s = b.stream("big")
        small = b"tiny"
        medium = bytes(range(256)) * 16          # 4 KiB, barely compressible
        large = b"0123456789abcdef" * (60_000)   # ~940 KiB, very compressible
        async with opened(s.append_session()) as session:
            tickets = [await within(session.submit(batch(small))),
                       await within(session.submit(batch(medium, medium))),
                       await within(session.submit(batch(large)))]
            acks = [await within(t) for t in tickets]
        assert [a.end.seq_num for a in acks] == [1, 3, 4]
        records = await read_all(s)
        assert bodies(records) == [small, medium, medium, large]
    finally:
        await within(s2.delete_basin(name, ignore_not_found=True))


async def test_producer_acks_each_record_with_its_own_seq_num(stream):
    async with opened(stream.producer(batching=Batching(max_records=7))) as producer:
        tickets = [await within(producer.submit(rec(f"p{i}"))) for i in range(50)]
        acks = [await within(t) for t in tickets]
    assert [a.seq_num for a in acks] == list(range(50))
    for a in acks:
        assert a.batch.start.seq_num <= a.seq_num < a.batch.end.seq_num
    assert bodies(await read_all(stream)) == [f"p{i}".encode() for i in range(50)]


async def test_producer_with_fencing_token_and_match_seq_num(stream):
    await append(stream, rec("tok", headers=[("", "fence")]))
    async with opened(stream.producer(fencing_token="tok", match_seq_num=1,
                                      batching=Batching(max_records=3))) as producer:
        tickets = [await within(producer.submit(rec(f"f{i}"))) for i in range(10)]
        acks = [await within(t) for t in tickets]
    assert [a.seq_num for a in acks] == list(range(1, 11))
    assert (await within(stream.check_tail())).seq_num == 11


async def test_match_seq_num_failure_ends_the_session_with_the_expected_seq_num(stream):
    session = stream.append_session()
    ok = await within(session.submit(batch("a", "b")))
    assert (await within(ok)).end.seq_num == 2
    bad = await within(session.submit(batch("c", match_seq_num=0)))
    with pytest.raises(SeqNumMismatchError) as err:
        await within(bad)
    assert err.value.expected_seq_num == 2
    assert err.value.status_code == 412
    with pytest.raises(SeqNumMismatchError):
        await within(session.close())
    assert bodies(await read_all(stream)) == [b"a", b"b"]


async def test_fencing_failure_ends_the_session_with_the_expected_token(stream):
    await append(stream, rec("right", headers=[("", "fence")]))
    session = stream.append_session()
    bad = await within(session.submit(batch("x", fencing_token="wrong")))
    with pytest.raises(FencingTokenMismatchError) as err:
        await within(bad)
    assert err.value.expected_fencing_token == "right"
    with pytest.raises(FencingTokenMismatchError):
        await within(session.close())
    assert (await within(stream.check_tail())).seq_num == 1


async def test_invalid_record_ends_the_session_with_422(stream):
    session = stream.append_session()
    bad = await within(session.submit(batch(rec("x", headers=[("", "no-such-command")]))))
    with pytest.raises(S2ServerError) as err:
        await within(bad)
    assert err.value.status_code == 422, vars(err.value)
    with pytest.raises(S2ServerError):
        await within(session.close())
    assert (await within(stream.check_tail())).seq_num == 0


async def test_session_on_a_missing_stream_fails_with_404(basin):
    session = basin.stream("not-there").append_session()
    ticket = await within(session.submit(batch("x")))
    with pytest.raises(S2ServerError) as err:
        await within(ticket)
    assert err.value.status_code == 404, vars(err.value)
    with pytest.raises(S2ServerError):
        await within(session.close())


async def test_session_larger_than_max_unacked_bytes_streams_through(stream):
    # 3 MiB through a 1 MiB unacked window: acks must flow while the client sends.
    body = b"w" * (256 * 1024 - 8)
    async with opened(stream.append_session(max_unacked_bytes=MIB)) as session:
        tickets = [await within(session.submit(batch(body))) for _ in range(12)]
    acks = [await within(t) for t in tickets]
    assert acks[-1].end.seq_num == 12
