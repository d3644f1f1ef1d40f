"""Streams through the SDK's basin operations (JSON over HTTP/2, basin named
by the `s2-basin` header): create_stream / list_streams (prefix, start_after,
limit) / get_stream_config / reconfigure_stream / ensure_stream /
delete_stream, names that need percent-encoding in the path, and the errors
for a stream that exists already or does not exist."""

import pytest
from s2_sdk import (EnsureStatus, S2ServerError, SeqNum, StreamConfig, Timestamping,
                    TimestampingMode)

from sdklib import append, bodies, eventually, read, within


async def names(basin, **kwargs):
    return [s.name async for s in basin.list_all_streams(**kwargs)]


async def test_create_stream_returns_its_info_and_lists_it(basin):
    info = await within(basin.create_stream("alpha"))
    assert info.name == "alpha"
    assert info.created_at is not None and info.deleted_at is None
    assert await names(basin) == ["alpha"]
    tail = await within(basin.stream("alpha").check_tail())
    assert tail.seq_num == 0


async def test_list_streams_filters_by_prefix_in_name_order_and_pages(basin):
    for name in ("logs.b", "logs.a", "logs.c", "metrics.x"):
        await within(basin.create_stream(name))
    page = await within(basin.list_streams(prefix="logs."))
    assert [s.name for s in page.items] == ["logs.a", "logs.b", "logs.c"]
    assert page.has_more is False
    page = await within(basin.list_streams(limit=2))
    assert [s.name for s in page.items] == ["logs.a", "logs.b"]
    assert page.has_more is True
    page = await within(basin.list_streams(start_after="logs.b"))
    assert [s.name for s in page.items] == ["logs.c", "metrics.x"]
    assert await names(basin, prefix="metrics") == ["metrics.x"]


async def test_stream_config_given_at_creation_reads_back(basin):
    config = StreamConfig(retention_policy=86400,
                          timestamping=Timestamping(mode=TimestampingMode.CLIENT_REQUIRE,
                                                    uncapped=True))
    await within(basin.create_stream("configured", config=config))
    got = await within(basin.get_stream_config("configured"))
    assert got.retention_policy == 86400
    assert got.timestamping.mode == TimestampingMode.CLIENT_REQUIRE
    assert got.timestamping.uncapped is True


async def test_new_stream_default_config_has_a_retention_and_timestamping(basin, stream):
    got = await within(basin.get_stream_config(stream.name))
    assert got.retention_policy == "infinite" or (isinstance(got.retention_policy, int)
                                                  and got.retention_policy > 0)
    mode = got.timestamping.mode if got.timestamping else None
    assert mode in (None, TimestampingMode.CLIENT_PREFER)


async def test_reconfigure_stream_changes_only_the_fields_given(basin):
    await within(basin.create_stream("re", config=StreamConfig(
        retention_policy=3600, timestamping=Timestamping(mode=TimestampingMode.ARRIVAL))))
    updated = await within(basin.reconfigure_stream("re", config=StreamConfig(
        retention_policy="infinite")))
    assert updated.retention_policy == "infinite"
    assert updated.timestamping.mode == TimestampingMode.ARRIVAL
    got = await within(basin.get_stream_config("re"))
    assert got.retention_policy == "infinite"
    assert got.timestamping.mode == TimestampingMode.ARRIVAL


async def test_ensure_stream_reports_created_then_unchanged_then_updated(basin):
    got = await within(basin.ensure_stream("ens"))
    assert (got.stream.name, got.status) == ("ens", EnsureStatus.CREATED)
    got = await within(basin.ensure_stream("ens"))
    assert got.status == EnsureStatus.CONFIG_UNCHANGED
    got = await within(basin.ensure_stream("ens", config=StreamConfig(retention_policy=600)))
    assert got.status == EnsureStatus.CONFIG_UPDATED
    assert (await within(basin.get_stream_config("ens"))).retention_policy == 600


async def test_creating_an_existing_stream_is_409(basin, stream):
    with pytest.raises(S2ServerError) as err:
        await within(basin.create_stream(stream.name))
    assert err.value.status_code == 409, vars(err.value)


async def test_delete_stream_removes_it(basin, stream):
    await append(stream, b"doomed")
    await within(basin.delete_stream(stream.name))

    async def gone():
        return stream.name not in await names(basin)

    # Deletion may be asynchronous (S2 answers 409 stream_deletion_pending
    # meanwhile); it must finish promptly on an idle server.
    await eventually(gone, what="deleted stream left the listing")
    with pytest.raises(S2ServerError) as err:
        await within(basin.get_stream_config(stream.name))
    assert err.value.status_code in (404, 409), vars(err.value)


async def test_delete_missing_stream_is_404_unless_ignored(basin):
    with pytest.raises(S2ServerError) as err:
        await within(basin.delete_stream("never-made"))
    assert err.value.status_code == 404, vars(err.value)
    await within(basin.delete_stream("never-made", ignore_not_found=True))


@pytest.mark.parametrize("name", ["a/b/c", "with space", "q?x=1&y#frag", "per%cent",
                                  "unicodé-✓", "...", "-dash-"])
async def test_names_needing_percent_encoding_round_trip(basin, name):
    await within(basin.create_stream(name))
    assert await names(basin) == [name]
    s = basin.stream(name)
    ack = await append(s, name)
    assert ack.end.seq_num == 1
    got = await read(s, start=SeqNum(0))
    assert bodies(got.records) == [name.encode()]
    assert (await within(s.check_tail())).seq_num == 1
    assert (await within(basin.get_stream_config(name))) is not None
