"""Verification after a restart: read every stream from its beginning and check
it against what was sent and acknowledged.

The rules, for every stream:

- what an earlier verification saw is still there, unchanged (the stream is
  read whole every time and compared with it byte for byte / message by message);
- the rest is whole appends the harness sent, one after another: nothing that
  was never sent, nothing torn (all of an append's bytes / messages / records,
  contiguous), nothing twice;
- every acknowledged append is there, at the offset (Durable Streams) or
  seq_num (S2) the server answered for it;
- a producer's appends are in seq order with no gap (a new epoch starts at 0);
- the offsets of the read responses agree with the data (ordinal = appends or
  messages before, byte position = their bytes; for JSON, the bytes of the
  normalised messages).

An append the kill left in flight may be there (whole) or not; whether it is
(its key in `stream.verified.ends`) is what recover.py holds its retry to.
"""

import json
from dataclasses import dataclass, field

import httpx

from workload import (BASIN, BYTE_HEADER, REQUEST_TIMEOUT_S, DsStream, describe, ds_offset,
                      normalized_json)

MAX_PAGES = 100_000
S2_READ_COUNT = 1000


class Broken(Exception):
    """The stream's content breaks a rule so that checking the rest is moot."""


@dataclass
class Verified:
    """What has been verified of one stream so far."""

    data: object = None          # byte streams: bytes; JSON: messages; S2: records
    order: list = field(default_factory=list)       # append keys in stream order
    ends: dict = field(default_factory=dict)        # key -> offset after it / S2 start seq
    ordinal_at: dict = field(default_factory=lambda: {0: 0})  # bytes: byte pos -> ordinal
    message_ends: list = field(default_factory=list)  # JSON: byte pos after each message
    last_of_producer: dict = field(default_factory=dict)  # producer -> (epoch, seq)


# --- reading ------------------------------------------------------------------

def read_ds_pages(client, path):
    """Every page of the stream from offset -1, following Stream-Next-Offset
    until Stream-Up-To-Date: [(body, next offset)]."""
    pages, offset = [], "-1"
    for _ in range(MAX_PAGES):
        r = client.get(path, params={"offset": offset})
        if r.status_code != 200:
            raise Broken(f"read at offset {offset} answered {r.status_code}: {describe(r)}")
        next_offset = r.headers.get("stream-next-offset")
        if not next_offset:
            raise Broken(f"read at offset {offset} has no Stream-Next-Offset: {describe(r)}")
        pages.append((r.content, next_offset))
        if r.headers.get("stream-up-to-date") == "true":
            return pages
        if next_offset == offset:
            raise Broken(f"read at offset {offset} made no progress and is not up to date")
        offset = next_offset
    raise Broken(f"more than {MAX_PAGES} pages")


def read_s2_records(client, stream):
    """(tail, every record as (body, headers)) of an S2 stream, read by seq_num
    from 0 to the tail, each record numbered as expected."""
    r = client.get(stream.tail_path)
    if r.status_code != 200:
        raise Broken(f"check-tail answered {r.status_code}: {describe(r)}")
    tail = r.json()["tail"]["seq_num"]
    records = []
    while len(records) < tail:
        r = client.get(stream.records_path,
                       params={"seq_num": len(records), "count": S2_READ_COUNT})
        if r.status_code != 200:
            raise Broken(f"read at seq_num {len(records)} answered {r.status_code}: {describe(r)}")
        page = r.json().get("records", [])
        if not page:
            raise Broken(f"read at seq_num {len(records)} returned no record below tail {tail}")
        for rec in page:
            if rec.get("seq_num") != len(records):
                raise Broken(f"record numbered {rec.get('seq_num')} where {len(records)} was due")
            records.append((rec.get("body"), rec.get("headers", [])))
    return tail, records


# --- shared rules -------------------------------------------------------------

def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def check_prefix_unchanged(name, now, before, unit):
    if now[:len(before)] != before:
        at = first_difference(now, before)
        raise Broken(f"{name}: {unit} verified at an earlier restart changed or vanished: "
                     f"first difference at {unit} {at} (had {len(before)}, now {len(now)})")


def check_producer_order(stream, key, v):
    """A producer's appends follow each other: seq + 1, or seq 0 of a newer epoch."""
    producer, epoch, seq = key
    prev = v.last_of_producer.get(producer)
    ok = seq == 0 if prev is None else (
        (epoch == prev[0] and seq == prev[1] + 1) or (epoch > prev[0] and seq == 0))
    if not ok:
        raise Broken(f"{stream.name}: producer {producer} append (epoch {epoch}, seq {seq}) "
                     f"follows {prev}: out of order or a gap")
    v.last_of_producer[producer] = (epoch, seq)


def known_append(stream, key, v, where):
    append = stream.sent.get(key)
    if append is None:
        raise Broken(f"{stream.name}: {where}: an append {key} the harness never sent")
    if key in v.ends:
        raise Broken(f"{stream.name}: {where}: append {key} is there twice "
                     f"(first ending at {v.ends[key]})")
    return append


def check_acked_in_place(stream, v, problems):
    """Every acknowledged append is there, at the offset the server answered."""
    for key, append in stream.sent.items():
        if not append.acked:
            continue
        if key not in v.ends:
            problems.append(f"{stream.name}: acknowledged append {key} (offset {append.offset}) "
                            f"is missing")
        elif v.ends[key] != append.offset:
            problems.append(f"{stream.name}: acknowledged append {key} was answered with "
                            f"offset {append.offset} but is at {v.ends[key]}")


# --- byte streams -----------------------------------------------------------

def verify_bytes(stream, pages):
    v = stream.verified
    content = b"".join(body for body, _ in pages)
    check_prefix_unchanged(stream.name, content, v.data, "byte")
    pos, ordinal = len(v.data), len(v.order)
    while pos < len(content):
        m = BYTE_HEADER.match(content, pos)
        if not m:
            raise Broken(f"{stream.name}: byte {pos}: bytes that start no append the harness "
                         f"sent (torn or foreign): {content[pos:pos + 48]!r}")
        index, producer, epoch, seq, _ = map(int, m.groups())
        if index != stream.index:
            raise Broken(f"{stream.name}: byte {pos}: an append of stream {index}")
        key = (producer, epoch, seq)
        append = known_append(stream, key, v, f"byte {pos}")
        end = pos + len(append.body)
        if content[pos:end] != append.body:
            raise Broken(f"{stream.name}: byte {pos}: append {key} is torn or altered "
                         f"({len(content[pos:end])} of {len(append.body)} bytes, "
                         f"first difference at +{first_difference(content[pos:end], append.body)})")
        check_producer_order(stream, key, v)
        pos, ordinal = end, ordinal + 1
        v.order.append(key)
        v.ends[key] = ds_offset(ordinal, pos)
        v.ordinal_at[pos] = ordinal
    v.data = content
    at = 0
    for body, next_offset in pages:
        at += len(body)
        if at not in v.ordinal_at:
            raise Broken(f"{stream.name}: a read page ends at byte {at}, inside an append")
        if next_offset != ds_offset(v.ordinal_at[at], at):
            raise Broken(f"{stream.name}: a read page ending at byte {at} gives "
                         f"Stream-Next-Offset {next_offset}, expected "
                         f"{ds_offset(v.ordinal_at[at], at)}")


# --- JSON streams -------------------------------------------------------------

def parse_json_pages(stream, pages):
    messages, page_ends = [], []
    for body, next_offset in pages:
        try:
            page = json.loads(body)
        except ValueError as e:
            raise Broken(f"{stream.name}: a read page is not JSON ({e}): {body[:200]!r}")
        if not isinstance(page, list):
            raise Broken(f"{stream.name}: a read page is not a JSON array: {body[:200]!r}")
        messages.extend(page)
        page_ends.append((len(messages), next_offset))
    return messages, page_ends


def verify_json(stream, pages):
    v = stream.verified
    messages, page_ends = parse_json_pages(stream, pages)
    check_prefix_unchanged(stream.name, messages, v.data, "message")
    i = len(v.data)
    byte_pos = v.message_ends[-1] if v.message_ends else 0
    while i < len(messages):
        found = stream.message_key(messages[i])
        if found is None:
            raise Broken(f"{stream.name}: message {i} is no message the harness sent: "
                         f"{str(messages[i])[:200]}")
        key, place = found
        if place != 0:
            raise Broken(f"{stream.name}: message {i} is message {place} of append {key} "
                         f"without the ones before it (torn append)")
        append = known_append(stream, key, v, f"message {i}")
        count = len(append.items)
        if messages[i:i + count] != append.items:
            raise Broken(f"{stream.name}: message {i}: append {key} is torn or altered "
                         f"({len(messages[i:i + count])} messages where {count} were sent)")
        check_producer_order(stream, key, v)
        for message in append.items:
            byte_pos += len(normalized_json(message).encode())
            v.message_ends.append(byte_pos)
        i += count
        v.order.append(key)
        v.ends[key] = ds_offset(i, byte_pos)
    v.data = messages
    for count, next_offset in page_ends:
        want = ds_offset(count, v.message_ends[count - 1] if count else 0)
        if next_offset != want:
            raise Broken(f"{stream.name}: a read page ending after message {count} gives "
                         f"Stream-Next-Offset {next_offset}, expected {want}")


# --- S2 streams ---------------------------------------------------------------

def verify_s2_records(stream, records):
    v = stream.verified
    check_prefix_unchanged(stream.name, records, v.data, "record")
    i = len(v.data)
    while i < len(records):
        body, _ = records[i]
        found = stream.batch_of(body or "")
        if found is None:
            raise Broken(f"{stream.name}: record {i} is no record the harness sent: "
                         f"{str(records[i])[:200]}")
        key, place = found
        if place != 0:
            raise Broken(f"{stream.name}: record {i} is record {place} of batch {key} "
                         f"without the ones before it (torn batch)")
        append = known_append(stream, key, v, f"record {i}")
        count = len(append.items)
        if records[i:i + count] != append.items:
            raise Broken(f"{stream.name}: record {i}: batch {key} is torn or altered")
        if i != append.match_seq_num:
            raise Broken(f"{stream.name}: batch {key} starts at seq_num {i} although it was "
                         f"sent with match_seq_num {append.match_seq_num}")
        v.order.append(key)
        v.ends[key] = i
        i += count
    v.data = records


def check_s2_tail_on_ds_face(client, stream, tail):
    """The same stream through Durable Streams ends at the same record ordinal."""
    r = client.head(stream.ds_path)
    offset = r.headers.get("stream-next-offset", "")
    if r.status_code != 200 or not offset.startswith(f"{tail:016d}_"):
        raise Broken(f"{stream.name}: S2 tail is {tail} but HEAD {stream.ds_path} answers "
                     f"{r.status_code} with Stream-Next-Offset {offset!r}")


# --- one stream, all streams ------------------------------------------------

def is_byte_stream(stream):
    return isinstance(stream, DsStream) and stream.kind == "bytes"


def verify_stream(client, stream):
    """Problems found in one stream (empty if none)."""
    if stream.verified is None:
        stream.verified = Verified(data=b"" if is_byte_stream(stream) else [])
    problems = []
    try:
        if isinstance(stream, DsStream):
            pages = read_ds_pages(client, stream.path)
            (verify_bytes if stream.kind == "bytes" else verify_json)(stream, pages)
        else:
            tail, records = read_s2_records(client, stream)
            verify_s2_records(stream, records)
            check_s2_tail_on_ds_face(client, stream, tail)
    except Broken as e:
        return [str(e) if str(e).startswith(stream.name) else f"{stream.name}: {e}"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        return [f"{stream.name}: verification could not read the stream: {e!r}"]
    check_acked_in_place(stream, stream.verified, problems)
    return problems


def verify_all(base_url, workload):
    """Problems found in every stream, and how many acknowledged appends were checked."""
    problems = []
    with httpx.Client(base_url=base_url, timeout=REQUEST_TIMEOUT_S, verify=False,
                      headers={"s2-basin": BASIN}) as client:
        for stream in workload.ds + workload.s2:
            problems += verify_stream(client, stream)
    return problems, workload.acked_count()


def read_prefix(client, path, offset, n):
    """(status, at least the first n bytes, or all, of a read from offset);
    the rest of the response is not fetched."""
    with client.stream("GET", path, params={"offset": offset}) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, r.content
        got = b""
        for chunk in r.iter_bytes():
            got += chunk
            if len(got) >= n:
                break
        return r.status_code, got


def read_from_offset_starts_with(client, stream, index):
    """Reading from the offset just before the index-th append of the stream
    starts with that append: for JSON, exactly its messages as Runnel stores
    them. Returns a problem or None (Durable Streams streams)."""
    v = stream.verified
    key = v.order[index]
    start = v.ends[v.order[index - 1]] if index else ds_offset(0, 0)
    append = stream.sent[key]
    if stream.kind == "bytes":
        want, then = append.body, None
    else:
        want = ("[" + ",".join(normalized_json(m) for m in append.items)).encode()
        then = (b",", b"]")  # the next message, or the end of the array
    status, got = read_prefix(client, stream.path, start, len(want) + 1)
    if status != 200:
        return f"{stream.name}: read at offset {start} answered {status}: {got[:200]!r}"
    if not got.startswith(want) or (then and got[len(want):len(want) + 1] not in then):
        return (f"{stream.name}: reading from offset {start} does not start with append {key}, "
                f"which follows it: {got[:120]!r}")
    return None
