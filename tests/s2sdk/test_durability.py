"""What the SDK sees across a server kill: acknowledged appends (unary and
session) are there after a SIGKILL and restart on the same data dir, and a
tailing read session ends with an error, not a hang, when its server dies.
These need a server of their own, so they skip when S2SDK_TESTS_URL is set."""

import pytest
from s2_sdk import S2Error, SeqNum

from sdklib import (append, batch, bodies, opened, read_all, take, unique_basin, unique_stream,
                    within)


@pytest.fixture
def own_server(server, runnel_suite):
    runnel_suite.skip_if_external()
    return server


async def test_acked_appends_survive_a_kill_and_restart(own_server, new_client):
    s2 = new_client()
    name, sname = unique_basin(), unique_stream()
    await within(s2.create_basin(name))
    b = s2.basin(name)
    await within(b.create_stream(sname))
    s = b.stream(sname)
    await append(s, b"u0", b"u1")
    async with opened(s.append_session()) as session:
        tickets = [await within(session.submit(batch(f"s{i}"))) for i in range(5)]
        acks = [await within(t) for t in tickets]
    assert acks[-1].end.seq_num == 7
    await within(s2.close())

    own_server.restart(kill=True)
    s2 = new_client()
    s = s2.basin(name).stream(sname)
    assert (await within(s.check_tail())).seq_num == 7
    assert bodies(await read_all(s)) == [b"u0", b"u1"] + [f"s{i}".encode() for i in range(5)]


async def test_a_tailing_session_ends_with_an_error_when_the_server_dies(own_server, new_client):
    s2 = new_client()
    name = unique_basin()
    await within(s2.create_basin(name))
    b = s2.basin(name)
    await within(b.create_stream("t"))
    s = b.stream("t")
    try:
        async with opened(s.read_session(start=SeqNum(0))) as session:
            await within(session.caught_up())
            own_server.kill()
            with pytest.raises(S2Error):
                await take(session, 1)
    finally:
        if own_server.proc is None:
            own_server.start()
