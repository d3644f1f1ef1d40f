"""Stream retention by age: records older than `retention_policy.age` are trimmed in the
background, through both faces, and the rest keep their sequence numbers and offsets."""

import time

import s2lib as s2
from s2lib import Basin


def test_records_older_than_the_retention_age_are_trimmed(c):
    """Ages count from when a record arrived (as in S2, whose store expires writes by age), so
    records written more than `age` ago go, whatever timestamps their client gave them."""
    basin = Basin.create(c)
    stream = basin.create_stream(config={"retention_policy": {"age": 1}})
    basin.ack(stream, ["old-1", "old-2"])
    time.sleep(1.2)
    basin.post(stream, {"records": [{"body": "fresh"}]})
    deadline = time.monotonic() + 20
    while True:
        records = basin.records(stream, seq_num=0, clamp="true")
        if not records or records[0]["seq_num"] >= 2:
            break
        assert time.monotonic() < deadline, f"old records were not trimmed: {records}"
        time.sleep(0.2)
    assert [r["body"] for r in records] in (["fresh"], []), "fresh goes too once a second old"
    assert basin.tail(stream)["seq_num"] == 3
    # The Durable Streams face agrees: the trimmed offsets are gone (410).
    r = c.get(s2.ds_path(basin.name, stream), params={"offset": "0000000000000000_0000000000000000"})
    assert r.status_code == 410, s2.describe(r)


def test_client_timestamps_in_the_past_do_not_make_records_expire(c):
    """A client may stamp records with any time (client-require, uncapped: `s2 bench` counts
    microseconds from its start); they still live `age` from their arrival."""
    basin = Basin.create(c)
    stream = basin.create_stream(config={
        "retention_policy": {"age": 3600},
        "timestamping": {"mode": "client-require", "uncapped": True}})
    basin.ack(stream, [{"body": "a", "timestamp": 1000}, {"body": "b", "timestamp": 2000}])
    time.sleep(6)  # longer than the retention sweep's 5 s period
    assert [r["body"] for r in basin.records(stream, seq_num=0)] == ["a", "b"]


def test_a_bounded_read_below_the_tail_of_trimmed_records_is_empty_not_416(c, basin, stream):
    """s2-lite's rule: 416 only for a start at or past the tail; a start whose records were all
    trimmed away reads nothing."""
    basin.ack(stream, ["x", "y"])
    trim = {"records": [{"headers": [["", "dHJpbQ=="]], "body": "AAAAAAAAAGQ="}]}
    r = basin.post(stream, trim, headers={"s2-format": "base64"})
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 10
    while True:
        r = c.get(f"/v1/streams/{stream}/records", params={"seq_num": 0, "count": 5},
                  headers=basin.headers())
        if r.status_code == 200 and r.json()["records"] == []:
            break
        assert r.status_code == 200, r.text
        assert time.monotonic() < deadline, r.text
        time.sleep(0.05)
    # The same start named from the tail (the trim record was the third): below it, so empty.
    r = c.get(f"/v1/streams/{stream}/records", params={"tail_offset": 2, "count": 5},
              headers=basin.headers())
    assert r.status_code == 200, r.text
    assert r.json()["records"] == []
    # At the tail is still 416.
    r = c.get(f"/v1/streams/{stream}/records", params={"tail_offset": 0, "count": 5},
              headers=basin.headers())
    assert r.status_code == 416, r.text


def test_delete_on_empty_deletes_a_stream_once_it_has_been_empty_for_its_min_age(c):
    """delete_on_empty.min_age_secs: a stream whose records are all trimmed goes once it has
    been empty that long, and one never written to once it is that old (the background pass
    runs every 5 s). One still holding a record stays."""
    basin = Basin.create(c)
    config = {"delete_on_empty": {"min_age_secs": 1}}
    emptied, holding, unwritten = (basin.create_stream(config=config) for _ in range(3))
    basin.ack(emptied, ["a"])
    basin.ack(holding, ["b"])
    basin.ack(emptied, [s2.trim_b64(2)], fmt="base64")  # trims "a" and itself
    deadline = time.monotonic() + 20
    for gone in (emptied, unwritten):
        while c.get(s2.stream_path(gone), headers=basin.headers()).status_code != 404:
            assert time.monotonic() < deadline, f"{gone} was not deleted"
            time.sleep(0.2)
    assert basin.stream_config(holding)["delete_on_empty"] == {"min_age_secs": 1}
    assert basin.tail(holding)["seq_num"] == 1
