"""Fencing: the fence command record (CommandRecord.fence: one header with an
empty name and value `fence`, the token as body) sets the stream's fencing
token; an append whose fencing_token differs is rejected with 412 and
FencingTokenMismatchError carrying the current token, and nothing of it is
written; the right token, or none at all, is accepted; an empty token
unfences."""

import pytest
from s2_sdk import CommandRecord, FencingTokenMismatchError, SeqNum

from sdklib import append, bodies, read, read_all, within


async def test_fence_command_is_acked_and_reads_back_as_a_command_record(stream):
    ack = await append(stream, CommandRecord.fence("token-1"))
    assert (ack.start.seq_num, ack.end.seq_num) == (0, 1)
    [got] = (await read(stream, start=SeqNum(0))).records
    assert got.is_command_record()
    assert got.headers == [(b"", b"fence")]
    assert got.body == b"token-1"


async def test_append_with_the_wrong_token_is_rejected_with_the_expected_one(stream):
    await append(stream, b"before", CommandRecord.fence("right"))
    with pytest.raises(FencingTokenMismatchError) as err:
        await append(stream, b"x", b"y", fencing_token="wrong")
    assert err.value.status_code == 412
    assert err.value.expected_fencing_token == "right"
    assert (await within(stream.check_tail())).seq_num == 2
    assert bodies(await read_all(stream)) == [b"before", b"right"]


async def test_append_with_the_right_token_or_without_one_is_accepted(stream):
    await append(stream, CommandRecord.fence("right"))
    ack = await append(stream, b"fenced", fencing_token="right")
    assert ack.start.seq_num == 1
    ack = await append(stream, b"unfenced writer")
    assert ack.start.seq_num == 2
    assert bodies(await read_all(stream, start=1)) == [b"fenced", b"unfenced writer"]


async def test_refencing_needs_the_current_token_and_an_empty_token_unfences(stream):
    await append(stream, CommandRecord.fence("first"))
    with pytest.raises(FencingTokenMismatchError) as err:
        await append(stream, CommandRecord.fence("hijack"), fencing_token="not-first")
    assert err.value.expected_fencing_token == "first"
    await append(stream, CommandRecord.fence("second"), fencing_token="first")
    with pytest.raises(FencingTokenMismatchError) as err:
        await append(stream, b"stale writer", fencing_token="first")
    assert err.value.expected_fencing_token == "second"
    await append(stream, CommandRecord.fence(""), fencing_token="second")
    with pytest.raises(FencingTokenMismatchError) as err:
        await append(stream, b"x", fencing_token="second")
    assert err.value.expected_fencing_token == ""
    ack = await append(stream, b"free again", fencing_token="")
    assert ack.start.seq_num == 3


async def test_a_36_byte_token_is_the_longest_allowed(stream):
    token = "t" * 36
    await append(stream, CommandRecord.fence(token))
    ack = await append(stream, b"ok", fencing_token=token)
    assert ack.start.seq_num == 1
