"""Basins through the SDK's account operations (JSON over HTTP/2):
create_basin / list_basins (prefix, start_after, limit) / get_basin_config /
reconfigure_basin / ensure_basin / delete_basin, and the basin config flags
create_stream_on_append and create_stream_on_read as the data plane sees them."""

import asyncio

import pytest
from s2_sdk import (BasinConfig, EnsureStatus, ReadUnwrittenError, S2ServerError, SeqNum,
                    StreamConfig, Timestamping, TimestampingMode)

from sdklib import WAIT_S, append, bodies, read, unique_basin, within

MADE = []


async def create(s2, name=None, **kwargs):
    name = name or unique_basin()
    MADE.append(name)
    info = await within(s2.create_basin(name, **kwargs), what="create_basin")
    return name, info


@pytest.fixture(autouse=True)
async def _delete_made_basins(s2):
    """Basins a test made (create / ensure_basin) are deleted after it, best effort."""
    yield
    while MADE:
        try:
            await asyncio.wait_for(s2.delete_basin(MADE.pop(), ignore_not_found=True), WAIT_S)
        except Exception:
            pass


async def listed(s2, prefix):
    return [b.name async for b in s2.list_all_basins(prefix=prefix)]


async def test_create_basin_returns_its_info_and_lists_it(s2):
    name, info = await create(s2)
    assert info.name == name
    assert info.created_at is not None and info.created_at.tzinfo is not None
    assert info.deleted_at is None
    page = await within(s2.list_basins(prefix=name))
    assert [b.name for b in page.items] == [name]
    assert page.has_more is False


async def test_list_basins_filters_by_prefix_in_name_order_and_pages(s2):
    prefix = unique_basin("lst")[:14]
    names = [f"{prefix}-{suffix}" for suffix in ("c", "a", "b")]
    for name in names:
        await create(s2, name)
    await create(s2, unique_basin("zzz"))  # not under the prefix
    page = await within(s2.list_basins(prefix=prefix))
    assert [b.name for b in page.items] == sorted(names)
    assert page.has_more is False
    page = await within(s2.list_basins(prefix=prefix, limit=2))
    assert [b.name for b in page.items] == sorted(names)[:2]
    assert page.has_more is True
    page = await within(s2.list_basins(prefix=prefix, start_after=sorted(names)[1]))
    assert [b.name for b in page.items] == sorted(names)[2:]
    assert await listed(s2, prefix) == sorted(names)


async def test_new_basin_has_the_default_config(s2):
    name, _ = await create(s2)
    config = await within(s2.get_basin_config(name))
    assert config.create_stream_on_append is False
    assert config.create_stream_on_read is False
    assert config.stream_cipher is None


async def test_basin_config_given_at_creation_reads_back(s2):
    dsc = StreamConfig(retention_policy="infinite",
                       timestamping=Timestamping(mode=TimestampingMode.ARRIVAL))
    name, _ = await create(s2, config=BasinConfig(default_stream_config=dsc,
                                                  create_stream_on_append=True))
    config = await within(s2.get_basin_config(name))
    assert config.create_stream_on_append is True
    assert config.create_stream_on_read is False
    assert config.default_stream_config is not None
    assert config.default_stream_config.retention_policy == "infinite"
    assert config.default_stream_config.timestamping.mode == TimestampingMode.ARRIVAL


async def test_reconfigure_basin_changes_only_the_fields_given(s2):
    dsc = StreamConfig(retention_policy=3600)
    name, _ = await create(s2, config=BasinConfig(default_stream_config=dsc,
                                                  create_stream_on_append=True))
    updated = await within(s2.reconfigure_basin(name, config=BasinConfig(
        create_stream_on_read=True)))
    assert updated.create_stream_on_read is True
    assert updated.create_stream_on_append is True
    assert updated.default_stream_config.retention_policy == 3600
    config = await within(s2.get_basin_config(name))
    assert (config.create_stream_on_append, config.create_stream_on_read) == (True, True)
    assert config.default_stream_config.retention_policy == 3600


async def test_delete_basin_takes_it_out_of_the_listing(s2):
    name, _ = await create(s2)
    await within(s2.delete_basin(name))
    # Deletion may be asynchronous: the basin is either gone or listed with
    # deleted_at set, which list_all_basins leaves out.
    assert await listed(s2, name) == []
    page = await within(s2.list_basins(prefix=name))
    assert all(b.deleted_at is not None for b in page.items), page
    with pytest.raises(S2ServerError) as err:
        await within(s2.reconfigure_basin(name, config=BasinConfig(create_stream_on_read=True)))
    assert err.value.status_code in (404, 409), vars(err.value)


async def test_creating_an_existing_basin_is_409(s2):
    name, _ = await create(s2)
    with pytest.raises(S2ServerError) as err:
        await within(s2.create_basin(name))
    assert err.value.status_code == 409, vars(err.value)


async def test_ensure_basin_reports_created_then_unchanged_then_updated(s2):
    name = unique_basin()
    MADE.append(name)
    got = await within(s2.ensure_basin(name))
    assert (got.basin.name, got.status) == (name, EnsureStatus.CREATED)
    got = await within(s2.ensure_basin(name))
    assert got.status == EnsureStatus.CONFIG_UNCHANGED
    got = await within(s2.ensure_basin(name, config=BasinConfig(create_stream_on_append=True)))
    assert got.status == EnsureStatus.CONFIG_UPDATED
    assert (await within(s2.get_basin_config(name))).create_stream_on_append is True


async def test_create_stream_on_append_makes_the_missing_stream_with_basin_defaults(s2):
    name, _ = await create(s2, config=BasinConfig(
        create_stream_on_append=True,
        default_stream_config=StreamConfig(retention_policy=7200)))
    b = s2.basin(name)
    ack = await append(b.stream("auto-created"), b"first")
    assert (ack.start.seq_num, ack.end.seq_num) == (0, 1)
    assert [s.name async for s in b.list_all_streams()] == ["auto-created"]
    assert (await within(b.get_stream_config("auto-created"))).retention_policy == 7200
    got = await read(b.stream("auto-created"), start=SeqNum(0))
    assert bodies(got.records) == [b"first"]


async def test_without_create_stream_on_append_a_missing_stream_is_404(s2):
    name, _ = await create(s2)
    b = s2.basin(name)
    with pytest.raises(S2ServerError) as err:
        await append(b.stream("absent"), b"x")
    assert err.value.status_code == 404, vars(err.value)
    assert [s.name async for s in b.list_all_streams()] == []


async def test_create_stream_on_read_makes_the_missing_stream(s2):
    name, _ = await create(s2, config=BasinConfig(create_stream_on_read=True))
    b = s2.basin(name)
    # The new stream is empty, so a unary read from 0 is at the tail: 416.
    with pytest.raises(ReadUnwrittenError) as err:
        await read(b.stream("made-by-read"), start=SeqNum(0))
    assert err.value.tail.seq_num == 0
    assert [s.name async for s in b.list_all_streams()] == ["made-by-read"]
    tail = await within(b.stream("made-by-read").check_tail())
    assert tail.seq_num == 0
