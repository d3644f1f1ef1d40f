"""Errors as the SDK sees them: the HTTP status and the JSON ErrorInfo body
({"code", "message"}) become S2ServerError(status_code, code, message).
Missing basin (404), missing stream (404) on every stream operation, bad
stream / basin config (422), malformed command records (422), timestamps
required but missing (422), and the batch limits the SDK enforces itself."""

import pytest
from s2_sdk import (BasinConfig, ReadLimit, Record, S2ClientError, S2ServerError, SeqNum,
                    StreamConfig, Timestamping, TimestampingMode)

from sdklib import MIB, append, batch, opened, rec, take, unique_basin, unique_stream, within


def assert_error(err, status, code=None):
    e = err.value
    assert e.status_code == status, vars(e)
    assert isinstance(e.message, str) and e.message, vars(e)
    if code is not None:
        assert e.code == code, vars(e)


async def test_stream_operations_in_a_missing_basin_are_404_basin_not_found(s2):
    b = s2.basin(unique_basin("gone"))
    s = b.stream("s")
    for op in (lambda: b.list_streams(), lambda: b.create_stream("s"),
               lambda: s.check_tail(), lambda: s.append(batch("x")),
               lambda: s.read(start=SeqNum(0))):
        with pytest.raises(S2ServerError) as err:
            await within(op())
        assert_error(err, 404, "basin_not_found")


async def test_missing_basin_config_is_404(s2):
    with pytest.raises(S2ServerError) as err:
        await within(s2.get_basin_config(unique_basin("gone")))
    assert_error(err, 404, "basin_not_found")


async def test_every_operation_on_a_missing_stream_is_404_stream_not_found(basin):
    s = basin.stream("missing")
    for op in (lambda: s.check_tail(), lambda: s.append(batch("x")),
               lambda: s.read(start=SeqNum(0)), lambda: basin.get_stream_config("missing"),
               lambda: basin.reconfigure_stream("missing", config=StreamConfig(
                   retention_policy=60)),
               lambda: basin.delete_stream("missing")):
        with pytest.raises(S2ServerError) as err:
            await within(op())
        assert_error(err, 404, "stream_not_found")
    async with opened(s.read_session(start=SeqNum(0))) as session:
        with pytest.raises(S2ServerError) as err:
            await take(session, 1)
    assert_error(err, 404, "stream_not_found")


async def test_bad_stream_config_is_rejected(basin, stream):
    with pytest.raises(S2ServerError) as err:
        await within(basin.create_stream(unique_stream(), config=StreamConfig(retention_policy=0)))
    assert_error(err, 422)
    with pytest.raises(S2ServerError) as err:
        await within(basin.reconfigure_stream(stream.name, config=StreamConfig(
            retention_policy=0)))
    assert_error(err, 422)
    assert [s.name async for s in basin.list_all_streams()] == [stream.name]


async def test_bad_basin_config_is_rejected(s2):
    name = unique_basin()
    with pytest.raises(S2ServerError) as err:
        await within(s2.create_basin(name, config=BasinConfig(
            default_stream_config=StreamConfig(retention_policy=0))))
    assert_error(err, 422)
    assert [b.name async for b in s2.list_all_basins(prefix=name)] == []


@pytest.mark.parametrize("record", [
    rec("x", headers=[("", "no-such-command")]),
    rec("x", headers=[("", "fence"), ("extra", "header")]),
    rec("t" * 37, headers=[("", "fence")]),
    rec(b"\x00\x01", headers=[("", "trim")]),
], ids=["unknown-command", "command-with-two-headers", "fence-token-37-bytes",
        "trim-body-not-8-bytes"])
async def test_malformed_command_records_are_422(stream, record):
    with pytest.raises(S2ServerError) as err:
        await append(stream, b"ok", record)
    assert_error(err, 422)
    assert (await within(stream.check_tail())).seq_num == 0


async def test_client_require_without_a_timestamp_is_422(basin):
    name = unique_stream()
    await within(basin.create_stream(name, config=StreamConfig(
        timestamping=Timestamping(mode=TimestampingMode.CLIENT_REQUIRE))))
    s = basin.stream(name)
    with pytest.raises(S2ServerError) as err:
        await append(s, rec("stamped", timestamp=5), rec("unstamped"))
    assert_error(err, 422)
    ack = await append(s, rec("stamped", timestamp=5))
    assert ack.start.seq_num == 0


async def test_oversize_batches_are_refused_by_the_sdk_itself(stream):
    """The SDK validates 1..=1000 records and <= 1 MiB metered before sending,
    so a server never sees these through it (tests/s2 covers the server's 422)."""
    for records in ([Record(body=b"")] * 1001, [Record(body=b"x" * MIB)], []):
        with pytest.raises(S2ClientError):
            await within(stream.append(batch(*records)))
    assert (await within(stream.check_tail())).seq_num == 0


async def test_bytes_limit_over_1_mib_is_clamped_not_rejected(stream):
    await append(stream, b"a")
    got = await within(stream.read(start=SeqNum(0), limit=ReadLimit(bytes=10 * MIB,
                                                                    count=5000)))
    assert [r.body for r in got.records] == [b"a"]
