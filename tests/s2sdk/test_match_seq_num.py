"""match_seq_num: an append that names the seq_num its first record must get
succeeds only at exactly the tail; otherwise 412 with SeqNumMismatchError
carrying the expected (tail) seq_num, and nothing of the batch is written.
In a session the check is against the tail as left by the batches pipelined
ahead of it, not only the durable one."""

import pytest
from s2_sdk import AppendInput, CommandRecord, FencingTokenMismatchError, SeqNumMismatchError

from sdklib import append, batch, bodies, opened, read_all, within


async def test_match_seq_num_at_the_tail_succeeds(stream):
    ack = await append(stream, b"a", match_seq_num=0)
    assert ack.start.seq_num == 0
    ack = await append(stream, b"b", b"c", match_seq_num=1)
    assert (ack.start.seq_num, ack.end.seq_num) == (1, 3)


async def test_mismatch_carries_the_expected_seq_num_and_writes_nothing(stream):
    await append(stream, b"a", b"b", b"c")
    for wrong in (0, 2, 4, 1000):
        with pytest.raises(SeqNumMismatchError) as err:
            await append(stream, b"x", match_seq_num=wrong)
        assert err.value.status_code == 412
        assert err.value.expected_seq_num == 3
    assert bodies(await read_all(stream)) == [b"a", b"b", b"c"]


async def test_mismatch_on_an_empty_stream_expects_zero(stream):
    with pytest.raises(SeqNumMismatchError) as err:
        await append(stream, b"x", match_seq_num=1)
    assert err.value.expected_seq_num == 0


async def test_pipelined_session_batches_match_against_the_pipelined_tail(stream):
    async with opened(stream.append_session()) as session:
        tickets = []
        for i in range(20):
            tickets.append(await within(session.submit(batch(f"{i}a", f"{i}b",
                                                             match_seq_num=2 * i))))
        acks = [await within(t) for t in tickets]
    assert [a.start.seq_num for a in acks] == list(range(0, 40, 2))


async def test_match_seq_num_and_fencing_token_are_both_checked(stream):
    await append(stream, CommandRecord.fence("tok"))
    with pytest.raises(SeqNumMismatchError):
        await within(stream.append(AppendInput(records=[CommandRecord.fence("tok")],
                                               fencing_token="tok", match_seq_num=0)))
    with pytest.raises(FencingTokenMismatchError):
        await append(stream, b"x", fencing_token="other", match_seq_num=1)
    ack = await append(stream, b"x", fencing_token="tok", match_seq_num=1)
    assert ack.start.seq_num == 1
