"""Stream management on the S2 basin API (/v1/streams): create, ensure, get and
reconfigure the config, list, delete; auto-creation by append / read with the
basin's create_stream_on_append / create_stream_on_read and the
`s2-stream-config` header."""

import json
import uuid

import pytest

import s2lib as s2
from s2lib import Basin, check, ds_path, expect_416, expect_error, json_of, stream_path, subset


def streams_listing(basin, **params):
    body = json_of(basin.c.get("/v1/streams", params=params, headers=basin.headers()))
    assert set(body) >= {"streams", "has_more"}, body
    assert isinstance(body["has_more"], bool)
    return [s["name"] for s in body["streams"]], body["has_more"]


# --- create ----------------------------------------------------------------------

def test_create_stream_is_201_with_stream_info(c, basin):
    info = json_of(c.post("/v1/streams", json={"stream": "info"}, headers=basin.headers()), 201)
    assert info["name"] == "info"
    assert "created_at" in info


def test_new_stream_is_empty(c, basin, stream):
    assert basin.tail(stream) == {"seq_num": 0, "timestamp": 0}


def test_create_existing_stream_is_409_resource_already_exists(c, basin, stream):
    r = c.post("/v1/streams", json={"stream": stream}, headers=basin.headers())
    expect_error(r, 409, "resource_already_exists")


def test_a_stream_create_retried_with_its_request_token_is_201_noop(c, basin):
    name, token = s2.unique_stream(), uuid.uuid4().hex
    body = {"stream": name, "config": {"retention_policy": {"age": 3600}}}
    headers = basin.headers({"s2-request-token": token})
    first = c.post("/v1/streams", json=body, headers=headers)
    again = c.post("/v1/streams", json=body, headers=headers)
    assert json_of(first, 201) == json_of(again, 201)
    assert (first.headers["s2-provision-result"], again.headers["s2-provision-result"]) == (
        "created", "noop")
    subset(basin.stream_config(name), body["config"])


def test_a_retry_spelling_the_same_config_differently_is_the_same_create(c, basin):
    name, token = s2.unique_stream(), uuid.uuid4().hex
    headers = basin.headers({"s2-request-token": token})
    check(c.post("/v1/streams", json={"stream": name}, headers=headers), 201)
    for config in ({}, {"future_knob": 1}):
        again = c.post("/v1/streams", json={"stream": name, "config": config}, headers=headers)
        assert json_of(again, 201)["name"] == name
        assert again.headers["s2-provision-result"] == "noop"


def test_a_stream_create_under_another_token_or_config_or_none_is_409(c, basin):
    name, token = s2.unique_stream(), uuid.uuid4().hex
    check(c.post("/v1/streams", json={"stream": name},
                 headers=basin.headers({"s2-request-token": token})), 201)
    for body, token_sent in [
        ({"stream": name}, uuid.uuid4().hex),
        ({"stream": name, "config": {"retention_policy": {"age": 60}}}, token),
        ({"stream": name}, None),
    ]:
        extra = {"s2-request-token": token_sent} if token_sent else {}
        r = c.post("/v1/streams", json=body, headers=basin.headers(extra))
        expect_error(r, 409, "resource_already_exists")


def test_a_stream_request_token_over_36_bytes_is_400_bad_header(c, basin):
    name = s2.unique_stream()
    r = c.post("/v1/streams", json={"stream": name},
               headers=basin.headers({"s2-request-token": "t" * 37}))
    expect_error(r, 400, "bad_header")
    check(c.get(stream_path(name), headers=basin.headers()), 404)


@pytest.mark.parametrize("content_type", [s2.OCTET, s2.TEXT, s2.JSON_CT])
def test_create_stream_existing_on_the_durable_streams_face_is_409(c, basin, content_type):
    """Whatever its settings there; S2's SDKs retry other 409 codes."""
    s2.ds_create(c, basin.name, "made-by-ds", content_type)
    r = c.post("/v1/streams", json={"stream": "made-by-ds"}, headers=basin.headers())
    expect_error(r, 409, "resource_already_exists")
    ensured = c.put(stream_path("made-by-ds"), json={"retention_policy": {"age": 77}},
                    headers=basin.headers())
    json_of(ensured, 200)
    subset(basin.stream_config("made-by-ds"), {"retention_policy": {"age": 77}})


@pytest.mark.parametrize("body", ["{", "{}", '{"stream": 5}', '{"stream": "x", "config": 1}'])
def test_create_stream_with_a_bad_json_body_is_400_bad_json(c, basin, body):
    r = c.post("/v1/streams", content=body,
               headers=basin.headers({"content-type": "application/json"}))
    expect_error(r, 400, "bad_json")


def test_unknown_config_fields_are_ignored_as_in_s2(c, basin):
    """A client newer than the server may send fields it does not know yet."""
    name = basin.create_stream(config={"retention_policy": {"age": 60}, "future_knob": 1})
    config = basin.stream_config(name)
    assert config["retention_policy"] == {"age": 60} and "future_knob" not in config
    json_of(c.patch(stream_path(name), json={"future_knob": 2}, headers=basin.headers()))
    json_of(c.put(stream_path(name), json={"future_knob": 3}, headers=basin.headers()))
    b = json_of(c.post("/v1/basins", json={"basin": s2.unique_basin(),
                                           "config": {"future_knob": True}}), 201)
    assert b["name"]


def test_create_stream_with_config_round_trips_through_get(c, basin):
    config = {"retention_policy": {"age": 86400},
              "timestamping": {"mode": "client-require", "uncapped": True}}
    name = basin.create_stream(config=config)
    subset(basin.stream_config(name), config)


def test_new_stream_config_defaults_to_client_prefer_timestamping(c, basin, stream):
    ts = basin.stream_config(stream).get("timestamping") or {}
    assert ts.get("mode") in (None, "client-prefer"), ts
    assert ts.get("uncapped") in (None, False), ts


# --- ensure (PUT) -------------------------------------------------------------------

def test_ensure_stream_is_201_when_created_then_200_when_it_exists(c, basin):
    assert json_of(c.put(stream_path("ens"), headers=basin.headers()), 201)["name"] == "ens"
    basin.ack("ens", ["kept"])
    assert json_of(c.put(stream_path("ens"), headers=basin.headers()), 200)["name"] == "ens"
    assert s2.bodies(basin.records("ens", seq_num=0)) == ["kept"]


def test_ensure_stream_with_config_creates_it_with_that_config(c, basin):
    config = {"retention_policy": {"age": 120}}
    json_of(c.put(stream_path("ens-cfg"), json=config, headers=basin.headers()), 201)
    subset(basin.stream_config("ens-cfg"), config)


def test_ensure_makes_an_existing_streams_config_the_one_given(c, basin):
    """What the new config leaves out goes back to what a new stream gets (the basin's
    default stream config, else the defaults); an ensure without a body does the same."""
    json_of(c.put(stream_path("ens-re"), json={"retention_policy": {"age": 60}},
                  headers=basin.headers()), 201)
    again = c.put(stream_path("ens-re"), json={"timestamping": {"mode": "arrival"}},
                  headers=basin.headers())
    json_of(again, 200)
    assert again.headers["s2-provision-result"] == "updated"
    config = basin.stream_config("ens-re")
    assert config["timestamping"]["mode"] == "arrival"
    assert config["retention_policy"] == {"infinite": {}}
    same = c.put(stream_path("ens-re"), json={"timestamping": {"mode": "arrival"}},
                 headers=basin.headers())
    assert same.headers["s2-provision-result"] == "noop"
    bare = c.put(stream_path("ens-re"), headers=basin.headers())
    assert bare.headers["s2-provision-result"] == "updated"
    assert basin.stream_config("ens-re")["timestamping"]["mode"] == "client-prefer"


# --- reconfigure ----------------------------------------------------------------------

RECONFIGURATIONS = {
    "retention_age": {"retention_policy": {"age": 3600}},
    "retention_infinite": {"retention_policy": {"infinite": {}}},
    "timestamping_arrival": {"timestamping": {"mode": "arrival"}},
    "timestamping_client_require": {"timestamping": {"mode": "client-require"}},
    "timestamping_client_prefer": {"timestamping": {"mode": "client-prefer"}},
    "timestamping_uncapped": {"timestamping": {"uncapped": True}},
    "storage_class": {"storage_class": "standard"},
    "delete_on_empty": {"delete_on_empty": {"min_age_secs": 600}},
}


@pytest.mark.parametrize("what", list(RECONFIGURATIONS))
def test_patch_stream_config_round_trips(c, basin, stream, what):
    change = RECONFIGURATIONS[what]
    got = json_of(c.patch(stream_path(stream), json=change, headers=basin.headers()))
    subset(got, change)
    subset(basin.stream_config(stream), change)


def test_patch_stream_leaves_unmentioned_fields_alone(c, basin):
    name = basin.create_stream(config={"retention_policy": {"age": 999},
                                       "timestamping": {"mode": "arrival"}})
    json_of(c.patch(stream_path(name), json={"timestamping": {"uncapped": True}},
                    headers=basin.headers()))
    subset(basin.stream_config(name), {"retention_policy": {"age": 999},
                                       "timestamping": {"mode": "arrival", "uncapped": True}})


def test_patch_stream_with_bad_json_is_400_bad_json(c, basin, stream):
    r = c.patch(stream_path(stream), content="[",
                headers=basin.headers({"content-type": "application/json"}))
    expect_error(r, 400, "bad_json")


# --- list -------------------------------------------------------------------------

def test_list_streams_in_name_order(c, basin):
    for name in ("c", "a", "b"):
        basin.create_stream(name)
    assert streams_listing(basin) == (["a", "b", "c"], False)


def test_list_streams_prefix_start_after_and_limit(c, basin):
    for name in ("x-1", "x-2", "x-3", "y-1"):
        basin.create_stream(name)
    assert streams_listing(basin, prefix="x-") == (["x-1", "x-2", "x-3"], False)
    assert streams_listing(basin, prefix="x-", limit=2) == (["x-1", "x-2"], True)
    assert streams_listing(basin, prefix="x-", start_after="x-2") == (["x-3"], False)
    assert streams_listing(basin, start_after="x-3") == (["y-1"], False)
    assert streams_listing(basin, prefix="x-", limit=0) == (["x-1", "x-2", "x-3"], False)


def test_list_streams_with_a_bad_limit_is_400_bad_query(c, basin):
    r = c.get("/v1/streams", params={"limit": "-1"}, headers=basin.headers())
    expect_error(r, 400, "bad_query")


def test_list_streams_shows_streams_created_on_the_durable_streams_face(c, basin):
    s2.ds_create(c, basin.name, "from-ds", s2.TEXT)
    assert streams_listing(basin) == (["from-ds"], False)


# --- delete -------------------------------------------------------------------------

def test_delete_stream_is_202_and_the_stream_is_gone(c, basin, stream):
    basin.ack(stream, ["bye"])
    check(c.delete(stream_path(stream), headers=basin.headers()), 202)
    expect_error(c.get(stream_path(stream), headers=basin.headers()), 404, "stream_not_found")
    expect_error(c.get(s2.tail_path(stream), headers=basin.headers()), 404, "stream_not_found")
    r = c.get(s2.records_path(stream), params={"seq_num": 0}, headers=basin.headers())
    expect_error(r, 404, "stream_not_found")
    assert streams_listing(basin) == ([], False)


def test_deleted_stream_is_gone_on_the_durable_streams_face(c, basin, stream):
    basin.ack(stream, ["bye"])
    check(c.delete(stream_path(stream), headers=basin.headers()), 202)
    check(c.get(ds_path(basin.name, stream), params={"offset": "-1"}), 404)
    check(c.head(ds_path(basin.name, stream)), 404)


def test_stream_recreated_after_delete_starts_empty(c, basin, stream):
    basin.ack(stream, ["a", "b"])
    check(c.delete(stream_path(stream), headers=basin.headers()), 202)
    basin.create_stream(stream)
    assert basin.tail(stream)["seq_num"] == 0


def test_stream_deleted_on_the_durable_streams_face_is_gone_on_s2(c, basin, stream):
    basin.ack(stream, ["x"])
    check(c.delete(ds_path(basin.name, stream)), 204)
    expect_error(c.get(s2.tail_path(stream), headers=basin.headers()), 404, "stream_not_found")


# --- auto-creation ----------------------------------------------------------------

def test_append_to_missing_stream_is_404_and_creates_nothing(c, basin):
    r = basin.post("ghost", {"records": [{"body": "x"}]})
    expect_error(r, 404, "stream_not_found")
    expect_error(c.get(stream_path("ghost"), headers=basin.headers()), 404, "stream_not_found")


def test_create_stream_on_append_creates_the_stream(c):
    b = Basin.create(c, config={"create_stream_on_append": True})
    ack = b.ack("auto", ["first"])
    assert ack["start"]["seq_num"] == 0 and ack["end"]["seq_num"] == 1
    assert s2.bodies(b.records("auto", seq_num=0)) == ["first"]
    assert streams_listing(b) == (["auto"], False)
    assert s2.media_type(s2.ds_head(c, b.name, "auto").headers["content-type"]) == s2.OCTET


def test_create_stream_on_append_honours_s2_stream_config_header(c):
    b = Basin.create(c, config={"create_stream_on_append": True})
    config = {"retention_policy": {"age": 4242}, "timestamping": {"mode": "arrival"}}
    b.ack("auto-cfg", ["x"], headers={"s2-stream-config": json.dumps(config)})
    subset(b.stream_config("auto-cfg"), config)


def test_s2_stream_config_header_is_ignored_when_the_stream_exists(c):
    b = Basin.create(c, config={"create_stream_on_append": True})
    b.create_stream("exists", config={"retention_policy": {"age": 100}})
    b.ack("exists", ["x"], headers={"s2-stream-config": json.dumps(
        {"retention_policy": {"age": 200}})})
    subset(b.stream_config("exists"), {"retention_policy": {"age": 100}})


def test_an_auto_created_stream_takes_what_the_header_leaves_out_from_the_basin_default(c):
    b = Basin.create(c, config={"create_stream_on_append": True,
                                "default_stream_config": {"storage_class": "standard",
                                                          "retention_policy": {"age": 50}}})
    b.ack("merged", ["x"], headers={"s2-stream-config": json.dumps(
        {"retention_policy": {"age": 60}})})
    subset(b.stream_config("merged"), {"storage_class": "standard",
                                       "retention_policy": {"age": 60}})


@pytest.mark.parametrize("header", ['{"retention_policy": {"age": 0}}', '{"storage_class": 7}',
                                    "not json"])
def test_a_bad_s2_stream_config_header_is_400_bad_header_even_when_nothing_is_created(c, header):
    b = Basin.create(c)
    b.create_stream("exists")
    h = {"s2-stream-config": header}
    expect_error(b.post("exists", {"records": [{"body": "x"}]}, headers=h), 400, "bad_header")
    r = c.get(s2.records_path("exists"), params={"seq_num": 0},
              headers=b.headers(h))
    expect_error(r, 400, "bad_header")
    assert b.tail("exists")["seq_num"] == 0, "the refused append wrote nothing"


def test_check_tail_ignores_the_s2_stream_config_header(c):
    b = Basin.create(c, config={"create_stream_on_read": True})
    h = b.headers({"s2-stream-config": json.dumps({"retention_policy": {"age": 0}})})
    assert json_of(c.get(s2.tail_path("by-tail"), headers=h))["tail"]["seq_num"] == 0
    assert b.stream_config("by-tail")["retention_policy"] == {"infinite": {}}


@pytest.mark.parametrize("body", [{"records": []},
                                  {"records": [{"body": "x"}] * 1001},
                                  {"records": [{"headers": [["", "bogus"]], "body": ""}]},
                                  {"records": [{"body": "x"}], "fencing_token": "t" * 37}])
def test_a_malformed_batch_is_422_and_auto_creates_nothing(c, body):
    b = Basin.create(c, config={"create_stream_on_append": True})
    expect_error(b.post("never", body), 422, "invalid")
    assert streams_listing(b) == ([], False)
    plain = Basin.create(c)
    expect_error(plain.post("missing", body), 422, "invalid")


def test_create_stream_on_append_does_not_create_on_read(c):
    b = Basin.create(c, config={"create_stream_on_append": True})
    r = c.get(s2.tail_path("not-yet"), headers=b.headers())
    expect_error(r, 404, "stream_not_found")


def test_create_stream_on_read_creates_the_stream_on_a_read(c):
    b = Basin.create(c, config={"create_stream_on_read": True})
    # The new stream is empty, so a bounded read from 0 is at the tail: 416.
    tail = expect_416(b.read("auto-read", status=416, seq_num=0, count=1))
    assert tail["seq_num"] == 0
    json_of(c.get(stream_path("auto-read"), headers=b.headers()))
    assert b.ack("auto-read", ["now it exists"])["start"]["seq_num"] == 0


def test_create_stream_on_read_creates_the_stream_on_check_tail(c):
    b = Basin.create(c, config={"create_stream_on_read": True})
    assert b.tail("auto-tail") == {"seq_num": 0, "timestamp": 0}
    assert streams_listing(b) == (["auto-tail"], False)


def test_create_stream_on_read_honours_s2_stream_config_header(c):
    b = Basin.create(c, config={"create_stream_on_read": True})
    config = {"retention_policy": {"age": 31337}}
    b.read("auto-read-cfg", status=416, seq_num=0, count=1,
           headers={"s2-stream-config": json.dumps(config)})
    subset(b.stream_config("auto-read-cfg"), config)


def test_create_stream_on_read_does_not_create_on_append(c):
    b = Basin.create(c, config={"create_stream_on_read": True})
    expect_error(b.post("nope", {"records": [{"body": "x"}]}), 404, "stream_not_found")


def test_auto_created_stream_inherits_the_basin_default_stream_config(c):
    b = Basin.create(c, config={"create_stream_on_append": True,
                                "default_stream_config": {"retention_policy": {"age": 555}}})
    b.ack("inherit", ["x"])
    subset(b.stream_config("inherit"), {"retention_policy": {"age": 555}})


def test_stream_management_on_unknown_basin_is_404(c):
    b = Basin(c, s2.unique_basin())
    r = c.put(stream_path(f"s{uuid.uuid4().hex[:6]}"), headers=b.headers())
    expect_error(r, 404, "basin_not_found")


@pytest.mark.parametrize("how", ["create", "patch"])
def test_a_storage_class_other_than_standard_or_express_is_400_bad_json(c, basin, stream, how):
    config = {"storage_class": "bogus"}
    if how == "create":
        r = c.post("/v1/streams", json={"stream": "odd-class", "config": config},
                   headers=basin.headers())
    else:
        r = c.patch(stream_path(stream), json=config, headers=basin.headers())
    expect_error(r, 400, "bad_json")
