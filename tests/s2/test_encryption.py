"""`s2-encryption-key` (may not be implemented yet; independent of the other
files, run it alone with `tests/s2/run test_encryption.py` or leave it out with
`--ignore=test_encryption.py`). Streams in a basin whose config has
"stream_cipher": "aes-256-gcm" need the same base64 32-byte key on every
append and read: a missing key is 400 bad_header, a wrong one 400
decryption_failed, ciphertext is never returned as data, and Durable Streams
reads of an encrypted stream are an error, never ciphertext."""

import os

import pytest

import s2lib as s2
from s2lib import (Basin, b64, batch_records, batches, check, event_id, expect_error, json_of,
                   metered, rec)

CIPHER = "aes-256-gcm"
PLAINTEXT = "attack at dawn"


def new_key():
    return b64(os.urandom(32))


@pytest.fixture
def cbasin(c):
    return Basin.create(c, config={"stream_cipher": CIPHER})


@pytest.fixture
def key():
    return new_key()


@pytest.fixture
def estream(cbasin, key):
    """An encrypted stream holding PLAINTEXT (with a header) and "second"."""
    name = cbasin.create_stream()
    cbasin.ack(name, [rec(PLAINTEXT, headers=[["secret-name", "secret-value"]]), "second"],
               headers={"s2-encryption-key": key})
    return name


def with_key(k):
    return {"s2-encryption-key": k}


def test_basin_stream_cipher_round_trips(c, cbasin):
    assert json_of(c.get(s2.basin_path(cbasin.name))).get("stream_cipher") == CIPHER


def test_streams_in_the_basin_are_listed_with_the_cipher(c, cbasin, estream):
    listed = json_of(c.get("/v1/streams", headers=cbasin.headers()))["streams"]
    assert [(s["name"], s.get("cipher")) for s in listed] == [(estream, CIPHER)]


def test_append_and_read_with_the_same_key_round_trip(cbasin, estream, key):
    got = cbasin.records(estream, headers=with_key(key), seq_num=0)
    assert s2.bodies(got) == [PLAINTEXT, "second"]
    assert got[0]["headers"] == [["secret-name", "secret-value"]]


def test_sse_read_with_the_key_decrypts(cbasin, estream, key):
    with cbasin.sse(estream, headers=with_key(key), seq_num=0, count=2) as s:
        events = s.expect_ok().rest()
    assert s2.bodies(batch_records(events)) == [PLAINTEXT, "second"]


def test_append_without_the_key_is_400_bad_header(cbasin, estream):
    expect_error(cbasin.append(estream, ["x"], status=400), 400, "bad_header")
    assert cbasin.tail(estream)["seq_num"] == 2


def test_read_without_the_key_is_400_bad_header(cbasin, estream):
    expect_error(cbasin.read(estream, status=400, seq_num=0), 400, "bad_header")


def test_read_with_a_wrong_key_is_400_decryption_failed(cbasin, estream):
    r = cbasin.read(estream, status=400, headers=with_key(new_key()), seq_num=0)
    expect_error(r, 400, "decryption_failed")
    assert PLAINTEXT.encode() not in r.content


def test_sse_read_with_a_wrong_key_never_sends_data(cbasin, estream):
    with cbasin.sse(estream, headers=with_key(new_key()), seq_num=0, count=2) as s:
        if s.response.status_code != 200:
            expect_error(s.response, 400, "decryption_failed")
            return
        events = s.rest()
    assert batch_records(events) == [], events
    errors = [e for e in events if e.type == "error"]
    assert errors and errors[-1].json()["code"] == "decryption_failed", events


def test_appends_under_another_key_are_refused_and_write_nothing(cbasin, estream):
    # Runnel binds a stream to the first key it is written with, so one stream never mixes
    # records that no single key can read.
    other = new_key()
    tail_before = cbasin.tail(estream)
    r = cbasin.append(estream, ["third"], status=400, headers=with_key(other))
    expect_error(r, 400, "decryption_failed")
    assert cbasin.tail(estream) == tail_before


def test_a_refused_first_append_does_not_make_its_key_the_streams(cbasin):
    # A stream takes the key of the first records written to it; an append refused before
    # writing anything (here on its match_seq_num) leaves it without one.
    name = cbasin.create_stream()
    refused, real = new_key(), new_key()
    r = cbasin.append(name, ["never"], status=412, headers=with_key(refused), match_seq_num=7)
    assert json_of(r, 412) == {"seq_num_mismatch": 0}
    cbasin.ack(name, ["written"], headers=with_key(real))
    assert s2.bodies(cbasin.records(name, headers=with_key(real), seq_num=0)) == ["written"]
    r = cbasin.read(name, status=400, headers=with_key(refused), seq_num=0)
    expect_error(r, 400, "decryption_failed")


def test_a_malformed_key_on_an_auto_creating_append_creates_no_stream(c):
    b = Basin.create(c, config={"stream_cipher": CIPHER, "create_stream_on_append": True})
    expect_error(b.append("auto", ["x"], status=400, headers=with_key("not base64!")), 400,
                 "bad_header")
    assert c.get(s2.stream_path("auto"), headers=b.headers()).status_code == 404


@pytest.mark.parametrize("bad", ["not base64!", b64(os.urandom(16)), b64(os.urandom(33)), ""])
def test_malformed_key_is_400_bad_header(cbasin, estream, bad):
    expect_error(cbasin.append(estream, ["x"], status=400, headers=with_key(bad)), 400,
                 "bad_header")
    expect_error(cbasin.read(estream, status=400, headers=with_key(bad), seq_num=0), 400,
                 "bad_header")


def test_durable_streams_read_of_an_encrypted_stream_is_an_error_never_ciphertext(c, cbasin,
                                                                                   estream):
    r = c.get(s2.ds_path(cbasin.name, estream), params={"offset": "-1"})
    assert r.status_code >= 400, s2.describe(r)
    assert PLAINTEXT.encode() not in r.content


def test_a_fork_of_an_encrypted_stream_is_refused_never_a_copy_of_its_ciphertext(c, cbasin,
                                                                                 estream):
    fork = s2.ds_path(cbasin.name, estream + "-fork")
    r = c.put(fork, headers={"content-type": "application/octet-stream",
                             "stream-forked-from": s2.ds_path(cbasin.name, estream)})
    assert r.status_code == 409, s2.describe(r)
    assert c.head(fork).status_code == 404


def test_durable_streams_create_in_an_encrypting_basin_is_409_never_a_clear_stream(c, cbasin):
    # Durable Streams has no way to give the key: such a stream would hold S2 records in the
    # clear in a basin whose streams are all meant to be sealed.
    path = s2.ds_path(cbasin.name, "clear")
    r = c.put(path, headers={"content-type": "application/octet-stream"}, content=b"secret")
    assert r.status_code == 409, s2.describe(r)
    assert "encrypted" in r.text
    assert c.head(path).status_code == 404


def test_durable_streams_create_repeated_after_the_basin_took_a_cipher_is_still_200(c):
    b = Basin.create(c)
    path = s2.ds_path(b.name, "clear")
    headers = {"content-type": "application/octet-stream"}
    check(c.put(path, headers=headers), 201)
    check(c.patch(s2.basin_path(b.name), json={"stream_cipher": CIPHER}), 200)
    check(c.put(path, headers=headers), 200)
    check(c.put(s2.ds_path(b.name, "another"), headers=headers), 409)


def test_stream_without_cipher_basin_needs_no_key(c):
    b = Basin.create(c)
    stream = b.create_stream()
    b.ack(stream, ["clear"])
    check(b.read(stream, seq_num=0), 200)


@pytest.mark.parametrize("cipher", ["bogus", "aegis-256"])
def test_reconfiguring_a_basin_to_a_cipher_runnel_does_not_offer_is_422(c, cipher):
    # As creating one with it is: streams would advertise a cipher they are not sealed with.
    b = Basin.create(c)
    r = c.patch(s2.basin_path(b.name), json={"stream_cipher": cipher})
    expect_error(r, 422, "invalid")
    assert json_of(c.get(s2.basin_path(b.name))).get("stream_cipher") is None


def test_reads_of_an_encrypted_stream_meter_the_plaintext_as_appends_do(cbasin, key):
    # Sealing adds a nonce and a tag to every body; S2 meters the plaintext, on reads (byte
    # limits, SSE event ids) as on appends.
    name = cbasin.create_stream()
    cbasin.ack(name, ["secret", rec("xyz", headers=[["ab", "cde"]])], headers=with_key(key))
    first, second = metered("secret"), metered("xyz", [["ab", "cde"]])
    assert cbasin.records(name, headers=with_key(key), seq_num=0, bytes=first - 1) == []
    got = cbasin.records(name, headers=with_key(key), seq_num=0, bytes=first)
    assert s2.bodies(got) == ["secret"]
    with cbasin.sse(name, headers=with_key(key), seq_num=0, count=2) as s:
        events = s.expect_ok().rest()
    assert event_id(batches(events)[-1]) == (1, 2, first + second)


def test_an_auto_creating_append_or_read_without_a_key_creates_no_stream(c):
    b = Basin.create(c, config={"stream_cipher": CIPHER, "create_stream_on_append": True,
                                "create_stream_on_read": True})
    expect_error(b.append("auto", ["x"], status=400), 400, "bad_header")
    expect_error(b.read("auto", status=400, seq_num=0), 400, "bad_header")
    assert c.get(s2.stream_path("auto"), headers=b.headers()).status_code == 404
    b.ack("auto", ["sealed"], headers=with_key(new_key()))
    assert c.get(s2.stream_path("auto"), headers=b.headers()).status_code == 200
