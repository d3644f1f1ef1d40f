"""After a restart has been verified, before writing more: what a client does
after a crash, held to the rules.

- A Durable Streams append the kill left in flight is retried with the same
  producer headers and body. If verification found it committed, the retry
  must be a duplicate (204, with its epoch and seq); if not, it must be
  accepted (200). Either way it then counts as acknowledged.
- An S2 batch left in flight is retried with the same match_seq_num: 412
  {"seq_num_mismatch": tail} if it was committed, 200 at that seq_num if not.
- Producer state survived: re-sending each producer's last acknowledged append
  is a duplicate (204).
- Offsets are real positions: reading from the offset just before an
  acknowledged append starts with that append.
"""

import httpx

from verify import read_from_offset_starts_with
from workload import describe, ds_client, s2_client


def retry_ds_in_flight(client, producer, violations):
    append, stream = producer.in_flight, producer.stream
    producer.in_flight = None
    committed = append.key in stream.verified.ends
    try:
        r = producer.post(client, append)
    except httpx.TransportError as e:
        violations.add(f"{producer.id}: retry of in-flight append {append.key} failed: {e!r}")
        return committed
    if committed:
        if r.status_code != 204:
            violations.add(f"{producer.id}: in-flight append {append.key} was committed before "
                           f"the kill, yet its retry answered {r.status_code}, not 204 "
                           f"(duplicate): {describe(r)}")
        elif producer.check_producer_headers(r, append, violations):
            append.acked, append.offset = True, stream.verified.ends[append.key]
            producer.last_acked = append
    elif r.status_code != 200:
        violations.add(f"{producer.id}: in-flight append {append.key} was not committed before "
                       f"the kill, yet its retry answered {r.status_code}, not 200: {describe(r)}")
    else:
        producer.take_ack(r, append, violations)
    return committed


def retry_s2_in_flight(client, stream, violations):
    append = stream.in_flight
    stream.in_flight = None
    committed = append.key in stream.verified.ends
    try:
        r = stream.post(client, append)
    except httpx.TransportError as e:
        violations.add(f"{stream.name}: retry of in-flight batch {append.key} failed: {e!r}")
        return committed
    if committed:
        want = {"seq_num_mismatch": stream.tail}
        if r.status_code != 412 or r.json() != want:
            violations.add(f"{stream.name}: in-flight batch {append.key} was committed before "
                           f"the kill, yet its retry with match_seq_num {append.match_seq_num} "
                           f"did not answer 412 {want}: {describe(r)}")
        else:
            append.acked, append.offset = True, stream.verified.ends[append.key]
    elif r.status_code != 200:
        violations.add(f"{stream.name}: in-flight batch {append.key} was not committed before "
                       f"the kill, yet its retry answered {r.status_code}, not 200: {describe(r)}")
    else:
        stream.take_ack(r, append, violations)
    return committed


def probe_producer_state(client, producer, violations):
    """Re-sending the last acknowledged append is answered as a duplicate."""
    append = producer.last_acked
    if append is None:
        return
    try:
        r = producer.post(client, append)
    except httpx.TransportError as e:
        violations.add(f"{producer.id}: producer-state probe failed: {e!r}")
        return
    if r.status_code != 204:
        violations.add(f"{producer.id}: re-sending the last acknowledged append {append.key} "
                       f"answered {r.status_code}, not 204 (producer state lost?): {describe(r)}")
    else:
        producer.check_producer_headers(r, append, violations)


def probe_offsets(client, stream, rng, violations, samples=2):
    """Reads from the offsets before a few acknowledged appends start with them."""
    order = stream.verified.order
    acked = [i for i, key in enumerate(order) if stream.sent[key].acked]
    for index in rng.sample(acked, min(samples, len(acked))):
        problem = read_from_offset_starts_with(client, stream, index)
        if problem:
            violations.add(problem)


def recover(base_url, workload, rngs, violations):
    """Retries, probes and epoch bumps after a verified restart; returns how
    many in-flight appends had been committed before the kill."""
    committed = 0
    with ds_client(base_url) as client:
        for producer in workload.producers:
            if producer.in_flight:
                committed += retry_ds_in_flight(client, producer, violations)
        with s2_client(base_url) as s2:
            for stream in workload.s2:
                stream.tail = len(stream.verified.data)
                if stream.in_flight:
                    committed += retry_s2_in_flight(s2, stream, violations)
        for producer in workload.producers:
            probe_producer_state(client, producer, violations)
        for stream in workload.ds:
            probe_offsets(client, stream, rngs["probes"], violations)
    # Now and then a producer opens a new epoch, as a restarted client would.
    for producer in workload.producers:
        if rngs["epochs"].random() < 0.1:
            producer.bump_epoch()
    return committed
