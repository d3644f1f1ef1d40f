"""Stream retention by age: records older than `retention_policy.age` are trimmed in the
background, through both faces, and the rest keep their sequence numbers and offsets."""

import time

import s2lib as s2
from s2lib import Basin


def test_records_older_than_the_retention_age_are_trimmed(c):
    basin = Basin.create(c)
    stream = basin.create_stream(config={"retention_policy": {"age": 60}})
    now_ms = int(time.time() * 1000)
    # Two records stamped two hours ago (client-prefer keeps past timestamps), then a fresh one.
    basin.ack(stream, [{"body": "old-1", "timestamp": now_ms - 7_200_000},
                       {"body": "old-2", "timestamp": now_ms - 7_200_000}])
    basin.ack(stream, ["fresh"])
    deadline = time.monotonic() + 20
    while True:
        records = basin.records(stream, seq_num=0)
        if records and records[0]["seq_num"] == 2:
            break
        assert time.monotonic() < deadline, f"old records were not trimmed: {records}"
        time.sleep(0.2)
    assert [r["body"] for r in records] == ["fresh"]
    assert basin.tail(stream)["seq_num"] == 3
    # The Durable Streams face agrees: the trimmed offsets are gone (410), the rest remains.
    r = c.get(s2.ds_path(basin.name, stream), params={"offset": "0000000000000000_0000000000000000"})
    assert r.status_code == 410, s2.describe(r)
    assert c.get(s2.ds_path(basin.name, stream), params={"offset": "-1"}).content == b"fresh"

