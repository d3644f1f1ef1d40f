"""The crash harness's workload: the streams, the producers writing them, the
appends they send and what the server answered.

Every append carries an identifiable payload, so that anything read back can be
traced to the one append that sent it:

- byte streams: `#<stream>/<producer>/<epoch>/<seq>/<n>#` and n random bytes;
- JSON streams: messages `{"s":…,"p":…,"e":…,"q":…,"i":…,"pad":…}` or
  `["m", s, p, e, q, i, pad]` (i = the message's place in its append); a body
  is one object or an array of messages (flattened one level by the server);
- S2 streams: records whose body is `s2|<stream>|<batch>|<i>|<pad>`, with
  headers naming the batch and the record's place in it.

The writers (one thread per producer, each with its own keep-alive client)
append until the server disappears; the append they were sending then is
`in_flight`: it may or may not have been committed.
"""

import json
import random
import re
import threading
from dataclasses import dataclass

import httpx

OCTET = "application/octet-stream"
JSON_CT = "application/json"

# Every request has a bounded wait; a kill ends any request at once anyway.
REQUEST_TIMEOUT_S = 10.0

DS_PREFIX = "/v1/stream/crash"
BASIN = "crash-harness"  # S2 basin names: 8-48 of [a-z0-9-]

BYTE_HEADER = re.compile(rb"#(\d+)/(\d+)/(\d+)/(\d+)/(\d+)#")

# Text for JSON pads and S2 bodies: multi-byte UTF-8 and characters JSON escapes.
PAD_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 é漢🙂\"\\/\n\t\x01\x7f\u2028"


def ds_offset(ordinal, byte_pos):
    """Runnel's Durable Streams offset: record ordinal and byte position of the next record."""
    return f"{ordinal:016d}_{byte_pos:016d}"


def normalized_json(value):
    """The text Runnel stores for one JSON message (compact, key order kept, UTF-8)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class Violations:
    """Rule violations found so far (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.items = []

    def add(self, message):
        with self._lock:
            self.items.append(message)

    def __len__(self):
        return len(self.items)


# Response headers every answer carries, left out of failure reports.
BORING_HEADERS = ("access-control-", "x-content-type-options", "cross-origin-", "date")


def describe(r):
    """A response, briefly, for a failure report."""
    headers = {k: v for k, v in r.headers.items() if not k.lower().startswith(BORING_HEADERS)}
    return (f"{r.request.method} {r.request.url} -> {r.status_code} "
            f"headers {headers} body {r.content[:300]!r}")


@dataclass(eq=False)
class Append:
    """One append sent (or being sent) to a stream.

    key: (producer, epoch, seq) on Durable Streams streams, (batch,) on S2 streams.
    body: the request body, exactly as sent (a retry sends it again).
    items: what it should put in the stream: [the body] on byte streams, the
        messages (parsed values) on JSON streams, (body, headers) records on S2.
    offset: once acknowledged, Stream-Next-Offset after it (Durable Streams) or
        the seq_num of its first record (S2).
    """

    key: tuple
    body: bytes
    items: list
    acked: bool = False
    offset: object = None
    match_seq_num: int = None  # S2 only


def payload_size(rng):
    """Mostly small appends, some medium, a few large (more time mid-write)."""
    roll = rng.random()
    if roll < 0.94:
        return rng.randint(0, 200)
    if roll < 0.99:
        return rng.randint(200, 2000)
    return rng.randint(2000, 32768)


def byte_payload_size(rng):
    """As payload_size, and now and then one of a few MiB: bodies that large are written to a
    file of their own before their commit, a path of its own to crash in."""
    if rng.random() < 0.003:
        return rng.randint(1 << 20, 3 << 20)
    return payload_size(rng)


def pad_text(rng, n):
    return "".join(rng.choice(PAD_CHARS) for _ in range(n))


# --- Durable Streams streams and their producers -----------------------------

class Producer:
    """An idempotent producer: a stable Producer-Id, an epoch, and a seq that
    goes up by one per append (a retry reuses the append's own seq)."""

    def __init__(self, stream, index, seed):
        self.stream = stream
        self.index = index
        self.id = f"crash-{stream.name}-p{index}"
        self.rng = random.Random(f"{seed}/{stream.name}/p{index}")
        self.epoch = 0
        self.next_seq = 0
        self.last_acked = None  # the last append the server accepted from us
        self.in_flight = None   # the append whose fate the kill left unknown

    def next_append(self):
        key = (self.index, self.epoch, self.next_seq)
        self.next_seq += 1
        body, items = self.stream.make_payload(key, self.rng)
        append = Append(key, body, items)
        self.stream.sent[key] = append
        return append

    def bump_epoch(self):
        """The next append opens a new epoch (seq 0), as a restarted client would."""
        self.epoch += 1
        self.next_seq = 0

    def headers(self, append):
        _, epoch, seq = append.key
        return {"Content-Type": self.stream.content_type, "Producer-Id": self.id,
                "Producer-Epoch": str(epoch), "Producer-Seq": str(seq)}

    def post(self, client, append):
        return client.post(self.stream.path, content=append.body, headers=self.headers(append))

    def check_producer_headers(self, r, append, violations):
        _, epoch, seq = append.key
        got = (r.headers.get("producer-epoch"), r.headers.get("producer-seq"))
        if got != (str(epoch), str(seq)):
            violations.add(f"{self.id}: answer to {append.key} carries Producer-Epoch/Seq "
                           f"{got}, expected {(str(epoch), str(seq))}: {describe(r)}")
            return False
        return True

    def take_ack(self, r, append, violations):
        """A 200 to a fresh append: record the offset the server gave it."""
        offset = r.headers.get("stream-next-offset")
        if not offset:
            violations.add(f"{self.id}: 200 without Stream-Next-Offset: {describe(r)}")
            return False
        if not self.check_producer_headers(r, append, violations):
            return False
        append.acked, append.offset = True, offset
        self.last_acked = append
        return True


class DsStream:
    """A Durable Streams stream (`bytes` or `json`) written by 1 or more producers."""

    def __init__(self, index, kind, producers, seed):
        self.index = index
        self.kind = kind
        self.name = f"{kind}-{index:02d}"
        self.path = f"{DS_PREFIX}/{self.name}"
        self.content_type = OCTET if kind == "bytes" else JSON_CT
        self.sent = {}  # key -> Append: everything that may be in the stream
        self.producers = [Producer(self, k, seed) for k in range(producers)]
        self.verified = None  # verify.py's record of what it has checked

    def make_payload(self, key, rng):
        if self.kind == "bytes":
            return self._byte_payload(key, rng)
        return self._json_payload(key, rng)

    def _byte_payload(self, key, rng):
        producer, epoch, seq = key
        n = byte_payload_size(rng)
        body = f"#{self.index}/{producer}/{epoch}/{seq}/{n}#".encode() + rng.randbytes(n)
        return body, [body]

    def _json_message(self, key, i, rng):
        producer, epoch, seq = key
        pad = pad_text(rng, payload_size(rng) // 4)
        if rng.random() < 0.25:
            return ["m", self.index, producer, epoch, seq, i, pad]
        return {"s": self.index, "p": producer, "e": epoch, "q": seq, "i": i, "pad": pad}

    def _json_payload(self, key, rng):
        count = rng.choice((1, 1, 1, 2, 3, 5))
        messages = [self._json_message(key, i, rng) for i in range(count)]
        if count == 1 and isinstance(messages[0], dict) and rng.random() < 0.5:
            value = messages[0]  # a single value: one message
        else:
            value = messages     # an array: one message per element
        separators = rng.choice(((",", ":"), (", ", ": ")))
        body = json.dumps(value, separators=separators, ensure_ascii=rng.random() < 0.5)
        return body.encode(), messages

    def message_key(self, message):
        """(append key, place in the append) of a JSON message we sent, else None."""
        try:
            if isinstance(message, dict) and message.get("s") == self.index:
                return (message["p"], message["e"], message["q"]), message["i"]
            if isinstance(message, list) and message[:2] == ["m", self.index]:
                return tuple(message[2:5]), message[5]
        except (KeyError, IndexError, TypeError):
            pass
        return None

    def create(self, client):
        r = client.put(self.path, headers={"Content-Type": self.content_type})
        if r.status_code != 201:
            raise RuntimeError(f"could not create {self.path}: {describe(r)}")


def ds_client(base_url):
    # verify=False: plain HTTP, and it spares loading CA certificates per client.
    return httpx.Client(base_url=base_url, timeout=REQUEST_TIMEOUT_S, verify=False)


def write_producer(producer, base_url, ready, stop, violations):
    """Thread body: append through one producer until `stop` or the server dies."""
    with ds_client(base_url) as client:
        ready.wait()
        while not stop.is_set():
            append = producer.next_append()
            try:
                r = producer.post(client, append)
            except httpx.TransportError:
                producer.in_flight = append
                return
            if r.status_code != 200:
                violations.add(f"{producer.id}: append {append.key} answered "
                               f"{r.status_code} while the server was up: {describe(r)}")
                return
            if not producer.take_ack(r, append, violations):
                return


# --- S2 streams ---------------------------------------------------------------

class S2Stream:
    """A stream written through the S2 face, one writer, every append
    conditional on `match_seq_num` so the position of each record is known."""

    def __init__(self, index, seed):
        self.index = index
        self.name = f"s2-{index:02d}"
        self.records_path = f"/v1/streams/{self.name}/records"
        self.tail_path = f"/v1/streams/{self.name}/records/tail"
        self.ds_path = f"/{BASIN}/{self.name}"
        self.rng = random.Random(f"{seed}/{self.name}")
        self.sent = {}  # (batch,) -> Append
        self.tail = 0   # the seq_num the next append must match
        self.next_batch = 0
        self.in_flight = None
        self.verified = None

    def next_append(self):
        batch = self.next_batch
        self.next_batch += 1
        records = []
        for i in range(self.rng.choice((1, 1, 2, 3, 5))):
            body = f"s2|{self.index}|{batch}|{i}|" + pad_text(self.rng, payload_size(self.rng) // 4)
            records.append((body, [["crash-batch", str(batch)], ["crash-i", str(i)]]))
        body = json.dumps({"records": [{"body": b, "headers": h} for b, h in records],
                           "match_seq_num": self.tail}).encode()
        append = Append((batch,), body, records, match_seq_num=self.tail)
        self.sent[append.key] = append
        return append

    def batch_of(self, body):
        """(batch, place) of a record body we sent, else None."""
        parts = body.split("|", 4)
        if len(parts) == 5 and parts[0] == "s2" and parts[1] == str(self.index):
            try:
                return (int(parts[2]),), int(parts[3])
            except ValueError:
                return None
        return None

    def post(self, client, append):
        return client.post(self.records_path, content=append.body)

    def take_ack(self, r, append, violations):
        """A 200 to an append: it must sit at match_seq_num, all records of it."""
        try:
            ack = r.json()
            start, end = ack["start"]["seq_num"], ack["end"]["seq_num"]
        except (ValueError, KeyError, TypeError):
            violations.add(f"{self.name}: unreadable AppendAck: {describe(r)}")
            return False
        want = (append.match_seq_num, append.match_seq_num + len(append.items))
        if (start, end) != want:
            violations.add(f"{self.name}: batch {append.key} acknowledged at {start}..{end}, "
                           f"expected {want[0]}..{want[1]}: {describe(r)}")
            return False
        append.acked, append.offset = True, start
        self.tail = end
        return True


def s2_client(base_url):
    return httpx.Client(base_url=base_url, timeout=REQUEST_TIMEOUT_S, verify=False,
                        headers={"s2-basin": BASIN, "Content-Type": JSON_CT})


def write_s2(stream, base_url, ready, stop, violations):
    """Thread body: append batches to one S2 stream until `stop` or the server dies."""
    with s2_client(base_url) as client:
        ready.wait()
        while not stop.is_set():
            append = stream.next_append()
            try:
                r = stream.post(client, append)
            except httpx.TransportError:
                stream.in_flight = append
                return
            if r.status_code != 200:
                violations.add(f"{stream.name}: batch {append.key} answered {r.status_code} "
                               f"while the server was up: {describe(r)}")
                return
            if not stream.take_ack(r, append, violations):
                return


def create_s2_streams(client, streams):
    r = client.post("/v1/basins", json={"basin": BASIN, "config": {}})
    if r.status_code not in (200, 201):
        raise RuntimeError(f"could not create basin {BASIN}: {describe(r)}")
    for stream in streams:
        r = client.put(f"/v1/streams/{stream.name}", json={},
                       headers={"s2-basin": BASIN})
        if r.status_code not in (200, 201):
            raise RuntimeError(f"could not create S2 stream {stream.name}: {describe(r)}")


# --- the whole workload -----------------------------------------------------

class Workload:
    def __init__(self, seed, streams, s2_streams):
        rng = random.Random(f"{seed}/mix")
        kinds = ["bytes", "json"] * (streams // 2) + ["bytes"] * (streams % 2)
        rng.shuffle(kinds)
        self.ds = [DsStream(i, kind, 2 if rng.random() < 0.3 else 1, seed)
                   for i, kind in enumerate(kinds)]
        self.s2 = [S2Stream(i, seed) for i in range(s2_streams)]

    @property
    def producers(self):
        return [p for stream in self.ds for p in stream.producers]

    def create(self, base_url):
        with ds_client(base_url) as client:
            for stream in self.ds:
                stream.create(client)
            if self.s2:
                create_s2_streams(client, self.s2)

    def start_writers(self, base_url, stop, violations):
        """One thread per producer and per S2 stream; returns once all of them
        have their client and are about to send their first append."""
        count = len(self.producers) + len(self.s2)
        ready = threading.Barrier(count + 1, timeout=REQUEST_TIMEOUT_S)
        args = (base_url, ready, stop, violations)
        threads = [threading.Thread(target=write_producer, args=(p, *args), name=p.id,
                                    daemon=True) for p in self.producers]
        threads += [threading.Thread(target=write_s2, args=(s, *args), name=s.name,
                                     daemon=True) for s in self.s2]
        for t in threads:
            t.start()
        ready.wait()
        return threads

    def acked_count(self):
        return sum(a.acked for s in self.ds + self.s2 for a in s.sent.values())

    def in_flight(self):
        return ([p.in_flight for p in self.producers if p.in_flight]
                + [s.in_flight for s in self.s2 if s.in_flight])
