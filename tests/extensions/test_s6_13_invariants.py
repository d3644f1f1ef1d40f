"""Seed 000 §6.13: the record-coordinate invariants as a randomised property
test. Random appends (single values, arrays, nested arrays, batches,
idempotent producers with retries, Stream-Record-Match, concurrent writers),
snapshot + retention moves, and SIGKILL restarts; after every step the
server must agree with a model of the stream:

  - ordinals are contiguous, never reused, never changed (envelope reads);
  - N - F equals the number of retained records;
  - offset reads and record reads expose the same sequence, and
    Stream-Next-Offset of a record read names the same boundary;
  - record < F is 410, record > N is 400.

The seed is printed in the pytest header; EXTENSIONS_SEED=<n> repeats a run.
"""

import json
import random
import threading
from concurrent.futures import ThreadPoolExecutor

from helpers import (ENVELOPE_NDJSON, JSON_CT, NDJSON, RECORDS_TOKEN, SEED, check, create_bucket,
                     describe, extension_tokens, frames, int_header, ndjson, spath)

STEPS = 150
FORCED_RESTARTS = {30, 75, 120, 149}


def random_value(rng, depth=0):
    kind = rng.choice(["int", "str", "bool", "null", "float", "obj", "arr"] if depth < 2
                      else ["int", "str", "bool", "null"])
    if kind == "int":
        return rng.choice([0, -1, 7, 2**31, -(2**53 - 1), rng.randrange(-1000, 1000)])
    if kind == "str":
        return rng.choice(["", "plain", "ünïcødé ✓", "line\nbreak", 'q"uote', "back\\slash",
                           "tab\t", "\u0000nul", "emoji 😀"]) + str(rng.randrange(100))
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "float":
        return rng.choice([0.5, -2.25, 1024.125])
    if kind == "obj":
        return {f"k{i}": random_value(rng, depth + 1) for i in range(rng.randrange(4))}
    return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]


def random_append(rng):
    """(body, the records it makes): one value, or an array of 1..4 values
    (elements may themselves be arrays: flattened exactly one level)."""
    if rng.random() < 0.5:
        value = random_value(rng)
        if isinstance(value, list):
            return json.dumps([value]), [value]
        return json.dumps(value), [value]
    values = [random_value(rng) for _ in range(rng.randrange(1, 5))]
    return json.dumps(values), values


class Model:
    def __init__(self):
        self.records = []   # every record ever appended; index = ordinal
        self.first = 0      # F
        self.snapshot = 0   # record of the visible snapshot, if any
        self.producer_seq = -1
        self.producer_log = {}  # seq -> (body, start, next)

    @property
    def next(self):
        return len(self.records)


def acked(r):
    assert RECORDS_TOKEN in extension_tokens(r), describe(r)
    return int_header(r, "stream-record-start"), int_header(r, "stream-record-next")


def verify(c, path, m, rng):
    f, n = m.first, m.next
    h = check(c.head(path), 200)
    assert (int_header(h, "stream-record-first"), int_header(h, "stream-record-next")) == (f, n)
    tail = h.headers["stream-next-offset"]

    # Every retained record, with its ordinal; N - F is their number.
    env = check(c.get(path, params={"record": str(f), "record_view": "envelope"}), 200)
    assert env.headers["content-type"].startswith(ENVELOPE_NDJSON)
    envelopes = ndjson(env)
    assert len(envelopes) == n - f
    assert envelopes == [{"record": f + i, "value": v} for i, v in enumerate(m.records[f:])]

    # Offset reads and record reads expose the same sequence.
    plain = check(c.get(path, params={"record": str(f)}), 200)
    assert plain.headers["content-type"].startswith(NDJSON)
    assert ndjson(plain) == m.records[f:]
    assert plain.headers["stream-next-offset"] == tail
    assert check(c.get(path, params={"offset": "-1"}), 200).json() == m.records[f:]

    # A random record boundary maps to the offset that resumes right there.
    r = rng.randint(f, n)
    k = rng.randint(1, 5)
    part = check(c.get(path, params={"record": str(r), "max_records": str(k)}), 200)
    assert ndjson(part) == m.records[r:r + k]
    assert int_header(part, "stream-record-start") == r
    assert int_header(part, "stream-record-next") == min(n, r + k)
    rest = check(c.get(path, params={"offset": part.headers["stream-next-offset"]}), 200)
    assert rest.json() == m.records[r + k:]

    t = rng.randint(0, n + 2)
    assert ndjson(check(c.get(path, params={"tail_records": str(t)}), 200)) == \
        m.records[max(f, n - t):]
    if f > 0:
        check(c.get(path, params={"record": str(rng.randrange(f))}), 410)
    check(c.get(path, params={"record": str(n + 1 + rng.randrange(3))}), 400)


def test_s6_13_invariants_under_random_appends_retention_and_restarts(server):
    rng = random.Random(SEED)
    print(f"EXTENSIONS_SEED={SEED}")
    c = server.client()
    path = spath(create_bucket(c), "inv")
    m = Model()
    initial_body, initial = random_append(rng)
    r = check(c.put(path, content=initial_body, headers={"Content-Type": JSON_CT}), 201)
    assert acked(r) == (0, len(initial))
    m.records += initial
    restarts = 0

    def post(body, headers=None, status=(200, 204)):
        h = {"Content-Type": JSON_CT, **(headers or {})}
        return check(c.post(path, content=body, headers=h), status)

    for step in range(STEPS):
        op = rng.choices(["append", "batch", "producer", "match", "concurrent", "retention",
                          "bad"], weights=[5, 2, 2, 1, 1, 2, 1])[0]
        if step in FORCED_RESTARTS or (op == "retention" and rng.random() < 0.2):
            if server.restartable:
                server.restart(kill=True)
                restarts += 1
                verify(c, path, m, rng)

        if op == "append":
            body, values = random_append(rng)
            assert acked(post(body)) == (m.next, m.next + len(values))
            m.records += values
        elif op == "batch":
            appends = [random_append(rng) for _ in range(rng.randint(1, 5))]
            acks = check(c.post(f"{path}/append-batch", content=frames(*[b for b, _ in appends]),
                                headers={"Content-Type": JSON_CT}), 200).json()
            assert len(acks) == len(appends)
            for ack, (_, values) in zip(acks, appends):
                assert ack["status"] == 204, ack
                assert (ack["stream_record_start"], ack["stream_record_next"]) == \
                    (m.next, m.next + len(values))
                m.records += values
        elif op == "producer":
            if m.producer_log and rng.random() < 0.4:
                # A retry of the latest request (e.g. its answer was lost).
                seq = m.producer_seq
                body, start, nxt = m.producer_log[seq]
                r = post(body, {"Producer-Id": "inv", "Producer-Epoch": "0",
                                "Producer-Seq": str(seq)}, status=204)
                assert acked(r) == (start, nxt), "a deduplicated retry moved its ordinals"
            else:
                m.producer_seq += 1
                body, values = random_append(rng)
                r = post(body, {"Producer-Id": "inv", "Producer-Epoch": "0",
                                "Producer-Seq": str(m.producer_seq)})
                got_range = acked(r)
                assert got_range == (m.next, m.next + len(values))
                m.producer_log[m.producer_seq] = (body, *got_range)
                m.records += values
        elif op == "match":
            body, values = random_append(rng)
            wrong = rng.choice([m.next + 1, m.next + 7] + ([m.next - 1] if m.next else []))
            r = post(body, {"Stream-Record-Match": str(wrong)}, status=412)
            assert int_header(r, "stream-record-next") == m.next
            assert acked(post(body, {"Stream-Record-Match": str(m.next)})) == \
                (m.next, m.next + len(values))
            m.records += values
        elif op == "concurrent":
            appends = [random_append(rng) for _ in range(4)]
            got = []
            lock = threading.Lock()

            def one(item):
                r = post(item[0])
                with lock:
                    got.append((acked(r), item[1]))

            with ThreadPoolExecutor(4) as pool:
                list(pool.map(one, appends))
            got.sort(key=lambda g: g[0][0])
            for (start, nxt), values in got:
                assert (start, nxt) == (m.next, m.next + len(values)), got
                m.records += values
        elif op == "retention":
            lo = max(m.first, m.snapshot)
            snap = rng.randint(lo, m.next)
            check(c.put(f"{path}/snapshot", params={"record": str(snap)},
                        content=json.dumps({"upto": snap}),
                        headers={"Content-Type": JSON_CT}), 204)
            m.snapshot = snap
            if snap > m.first:
                keep = rng.randint(m.first + 1, snap)
                check(c.put(f"{path}/retention", params={"record": str(keep)}), 204)
                m.first = keep
        elif op == "bad":
            # Failed appends take no ordinal.
            post(rng.choice(["[]", "{oops", '{"a":1}{"b":2}']), status=400)
        verify(c, path, m, rng)

    if server.restartable:
        assert restarts >= len(FORCED_RESTARTS)
        server.restart(kill=True)
        verify(c, path, m, rng)
    print(f"{m.next} records, first retained {m.first}, {restarts} restarts")
