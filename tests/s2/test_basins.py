"""Basin management on the S2 account API (/v1/basins): create, ensure, get and
reconfigure the config, list, delete; S2's basin name rule; a basin is a
Runnel bucket and a bucket made through PUT /{bucket} is usable as a basin."""

import uuid

import pytest

import s2lib as s2
from s2lib import (Basin, basin_path, check, expect_error, json_of, stream_path, subset,
                   unique_basin)


def basin_config(c, name):
    return json_of(c.get(basin_path(name)))


# --- create -----------------------------------------------------------------------

def test_create_basin_is_201_with_basin_info(c):
    name = unique_basin()
    info = json_of(c.post("/v1/basins", json={"basin": name}), 201)
    assert info["name"] == name
    assert info.get("state") == "active"


def test_a_basin_config_over_64_kib_is_413_and_creates_nothing(c):
    # A basin's config is kept as sent and read on every request to its streams.
    name = unique_basin()
    r = c.post("/v1/basins", json={"basin": name, "config": {"padding": "x" * (64 << 10)}})
    expect_error(r, 413, "invalid")
    assert c.get(basin_path(name)).status_code == 404


def test_create_basin_with_config_round_trips_through_get(c):
    name = unique_basin()
    config = {"create_stream_on_append": True, "create_stream_on_read": False,
              "default_stream_config": {"retention_policy": {"age": 3600},
                                        "timestamping": {"mode": "arrival", "uncapped": False}}}
    json_of(c.post("/v1/basins", json={"basin": name, "config": config}), 201)
    subset(basin_config(c, name), config)


def test_new_basin_config_has_auto_create_off(c):
    name = Basin.create(c).name
    got = basin_config(c, name)
    assert got["create_stream_on_append"] is False
    assert got["create_stream_on_read"] is False


def test_create_existing_basin_is_409_resource_already_exists(c, basin):
    expect_error(c.post("/v1/basins", json={"basin": basin.name}), 409, "resource_already_exists")


# --- retried creates (s2-request-token) ----------------------------------------

def test_a_create_retried_with_its_request_token_is_201_noop_with_the_same_basin(c):
    name, token = unique_basin(), uuid.uuid4().hex
    body = {"basin": name, "config": {"create_stream_on_append": True}}
    first = c.post("/v1/basins", json=body, headers={"s2-request-token": token})
    again = c.post("/v1/basins", json=body, headers={"s2-request-token": token})
    assert json_of(first, 201) == json_of(again, 201)
    assert first.headers["s2-provision-result"] == "created"
    assert again.headers["s2-provision-result"] == "noop"


def test_a_create_under_another_token_or_config_or_none_is_409(c):
    name, token = unique_basin(), uuid.uuid4().hex
    check(c.post("/v1/basins", json={"basin": name}, headers={"s2-request-token": token}), 201)
    for body, headers in [
        ({"basin": name}, {"s2-request-token": uuid.uuid4().hex}),
        ({"basin": name, "config": {"create_stream_on_read": True}}, {"s2-request-token": token}),
        ({"basin": name}, {}),
    ]:
        expect_error(c.post("/v1/basins", json=body, headers=headers), 409, "resource_already_exists")
    assert basin_config(c, name).get("create_stream_on_read") in (None, False)


def test_a_request_token_over_36_bytes_is_400_bad_header_and_creates_nothing(c):
    name = unique_basin()
    r = c.post("/v1/basins", json={"basin": name}, headers={"s2-request-token": "t" * 37})
    expect_error(r, 400, "bad_header")
    expect_error(c.get(f"/v1/basins/{name}"), 404, "basin_not_found")


def test_a_retried_create_is_recognised_after_a_restart(start_server):
    srv = start_server()
    c = srv.client()
    name, token = unique_basin(), uuid.uuid4().hex
    check(c.post("/v1/basins", json={"basin": name}, headers={"s2-request-token": token}), 201)
    srv.restart()
    again = c.post("/v1/basins", json={"basin": name}, headers={"s2-request-token": token})
    check(again, 201)
    assert again.headers["s2-provision-result"] == "noop"


def test_create_basin_named_like_an_existing_bucket_is_409(c):
    name = unique_basin()
    check(c.put(f"/{name}"), 201)
    expect_error(c.post("/v1/basins", json={"basin": name}), 409, "resource_already_exists")


VALID_NAMES = {
    "eight_bytes": lambda u: u[:8],
    "forty_eight_bytes": lambda u: (u + u)[:48],
    "inner_hyphens": lambda u: f"a-{u[:6]}-9",
    "digits_at_both_ends": lambda u: f"7{u[:10]}7",
}


@pytest.mark.parametrize("shape", list(VALID_NAMES))
def test_basin_names_following_the_s2_rule_are_accepted(c, shape):
    name = VALID_NAMES[shape](uuid.uuid4().hex)
    assert json_of(c.post("/v1/basins", json={"basin": name}), 201)["name"] == name
    basin_config(c, name)


INVALID_NAMES = {
    "seven_bytes": lambda u: u[:7],
    "forty_nine_bytes": lambda u: (u + u)[:49],
    "uppercase": lambda u: f"A{u[:10]}",
    "underscore": lambda u: f"a_{u[:10]}",
    "dot": lambda u: f"a.{u[:10]}",
    "leading_hyphen": lambda u: f"-{u[:10]}",
    "trailing_hyphen": lambda u: f"{u[:10]}-",
    "empty": lambda u: "",
}


@pytest.mark.parametrize("shape", list(INVALID_NAMES))
def test_create_basin_breaking_the_s2_name_rule_is_422_invalid(c, shape):
    name = INVALID_NAMES[shape](uuid.uuid4().hex)
    expect_error(c.post("/v1/basins", json={"basin": name}), 422, "invalid")


@pytest.mark.parametrize("shape", [s for s in INVALID_NAMES if s != "empty"])
def test_ensure_basin_breaking_the_s2_name_rule_is_422_invalid(c, shape):
    name = INVALID_NAMES[shape](uuid.uuid4().hex)
    expect_error(c.put(basin_path(name)), 422, "invalid")


@pytest.mark.parametrize("body", ["{", "[]", '{"config": {}}', '{"basin": 7}',
                                  '{"basin": "%s", "config": {"create_stream_on_append": "yes"}}'])
def test_create_basin_with_a_bad_json_body_is_400_bad_json(c, body):
    if "%s" in body:
        body = body % unique_basin()
    r = c.post("/v1/basins", content=body, headers={"content-type": "application/json"})
    expect_error(r, 400, "bad_json")


# --- ensure (PUT) ---------------------------------------------------------------------

def test_ensure_basin_is_201_when_created_then_200_when_it_exists(c):
    name = unique_basin()
    assert json_of(c.put(basin_path(name)), 201)["name"] == name
    assert json_of(c.put(basin_path(name)), 200)["name"] == name
    basin_config(c, name)


def test_ensure_basin_with_config_creates_it_with_that_config(c):
    name = unique_basin()
    config = {"create_stream_on_read": True}
    json_of(c.put(basin_path(name), json={"config": config}), 201)
    subset(basin_config(c, name), config)


def test_ensure_makes_an_existing_basins_config_the_one_given(c):
    """S2's ensure: "its configuration is updated to the specified configuration, if
    different". What the new config leaves out goes back to the default."""
    name = unique_basin()
    json_of(c.put(basin_path(name), json={"config": {"create_stream_on_read": True}}), 201)
    again = c.put(basin_path(name), json={"config": {"create_stream_on_append": True}})
    json_of(again, 200)
    assert again.headers["s2-provision-result"] == "updated"
    config = basin_config(c, name)
    assert config["create_stream_on_append"] is True
    assert config.get("create_stream_on_read") in (None, False)
    same = c.put(basin_path(name), json={"config": {"create_stream_on_append": True}})
    assert same.headers["s2-provision-result"] == "noop"


# --- get / reconfigure ------------------------------------------------------------

def test_get_config_of_missing_basin_is_404_basin_not_found(c):
    expect_error(c.get(basin_path(unique_basin())), 404, "basin_not_found")


def test_patch_basin_config_returns_and_keeps_the_new_config(c, basin):
    got = json_of(c.patch(basin_path(basin.name), json={"create_stream_on_append": True}))
    assert got["create_stream_on_append"] is True
    assert got["create_stream_on_read"] is False
    again = basin_config(c, basin.name)
    assert again["create_stream_on_append"] is True and again["create_stream_on_read"] is False


def test_patch_basin_default_stream_config_round_trips(c, basin):
    dsc = {"retention_policy": {"infinite": {}},
           "timestamping": {"mode": "client-require", "uncapped": True}}
    got = json_of(c.patch(basin_path(basin.name), json={"default_stream_config": dsc}))
    subset(got, {"default_stream_config": dsc})
    subset(basin_config(c, basin.name), {"default_stream_config": dsc})


def test_patch_basin_leaves_unmentioned_fields_alone(c):
    name = Basin.create(c, config={"create_stream_on_read": True,
                                   "default_stream_config": {"retention_policy": {"age": 60}}}).name
    json_of(c.patch(basin_path(name), json={"create_stream_on_append": True}))
    subset(basin_config(c, name), {"create_stream_on_read": True, "create_stream_on_append": True,
                                   "default_stream_config": {"retention_policy": {"age": 60}}})


def test_patch_missing_basin_is_404_basin_not_found(c):
    r = c.patch(basin_path(unique_basin()), json={"create_stream_on_read": True})
    expect_error(r, 404, "basin_not_found")


def test_patch_basin_with_bad_json_is_400_bad_json(c, basin):
    r = c.patch(basin_path(basin.name), content="{nope",
                headers={"content-type": "application/json"})
    expect_error(r, 400, "bad_json")


def test_basin_default_stream_config_applies_to_new_streams(c):
    b = Basin.create(c, config={"default_stream_config": {
        "retention_policy": {"age": 7200}, "timestamping": {"mode": "arrival"}}})
    stream = b.create_stream()
    subset(b.stream_config(stream), {"retention_policy": {"age": 7200},
                                     "timestamping": {"mode": "arrival"}})


def default_filled_basin(c):
    return Basin.create(c, config={"default_stream_config": {
        "retention_policy": {"age": 7200},
        "timestamping": {"mode": "arrival", "uncapped": True},
        "delete_on_empty": {"min_age_secs": 90}}})


def test_a_stream_config_takes_each_field_it_leaves_out_from_the_basin_default(c):
    b = default_filled_basin(c)
    stream = b.create_stream(config={"timestamping": {"mode": "client-require"}})
    subset(b.stream_config(stream), {
        "retention_policy": {"age": 7200},
        "timestamping": {"mode": "client-require", "uncapped": True},
        "delete_on_empty": {"min_age_secs": 90}})


def test_an_ensured_stream_config_takes_each_field_it_leaves_out_from_the_basin_default(c):
    b = default_filled_basin(c)
    stream = b.create_stream(config={"retention_policy": {"age": 60}})
    r = c.put(stream_path(stream), json={"storage_class": "standard"}, headers=b.headers())
    json_of(r, 200)
    assert r.headers["s2-provision-result"] == "updated"
    subset(b.stream_config(stream), {
        "storage_class": "standard",
        "retention_policy": {"age": 7200},
        "timestamping": {"mode": "arrival", "uncapped": True}})


def test_a_field_reset_with_null_takes_the_basin_default_again(c):
    b = default_filled_basin(c)
    stream = b.create_stream(config={"retention_policy": {"age": 60},
                                     "timestamping": {"mode": "client-prefer"}})
    got = json_of(c.patch(stream_path(stream),
                          json={"retention_policy": None, "timestamping": {"mode": None}},
                          headers=b.headers()))
    subset(got, {"retention_policy": {"age": 7200}, "timestamping": {"mode": "arrival"}})
    subset(b.stream_config(stream), got)


def test_a_basin_default_changed_later_leaves_existing_streams_as_they_are(c):
    b = default_filled_basin(c)
    stream = b.create_stream()
    json_of(c.patch(basin_path(b.name),
                    json={"default_stream_config": {"retention_policy": {"age": 30}}}))
    subset(b.stream_config(stream), {"retention_policy": {"age": 7200}})
    subset(b.stream_config(b.create_stream()), {"retention_policy": {"age": 30}})


# --- list -------------------------------------------------------------------------

def make_family(c, n=3):
    prefix = f"l{uuid.uuid4().hex[:10]}-"
    names = [f"{prefix}{i}x" for i in range(n)]
    for name in reversed(names):
        Basin.create(c, name)
    return prefix, names


def listing(c, **params):
    body = json_of(c.get("/v1/basins", params=params))
    assert set(body) >= {"basins", "has_more"}, body
    assert isinstance(body["has_more"], bool)
    return [b["name"] for b in body["basins"]], body["has_more"], body


def test_list_basins_by_prefix_in_name_order(c):
    prefix, names = make_family(c)
    got, has_more, body = listing(c, prefix=prefix)
    assert got == names and has_more is False
    assert all(b.get("state") == "active" for b in body["basins"])
    assert all(b["location"] is None for b in body["basins"]), "S2's current BasinInfo"


def test_list_basins_limit_sets_has_more(c):
    prefix, names = make_family(c)
    assert listing(c, prefix=prefix, limit=2)[:2] == (names[:2], True)
    assert listing(c, prefix=prefix, limit=3)[:2] == (names, False)


def test_list_basins_start_after_is_exclusive(c):
    prefix, names = make_family(c)
    assert listing(c, prefix=prefix, start_after=names[0])[:2] == (names[1:], False)
    assert listing(c, prefix=prefix, start_after=names[-1])[:2] == ([], False)


def test_list_basins_limit_0_means_no_particular_limit(c):
    prefix, names = make_family(c)
    assert listing(c, prefix=prefix, limit=0)[:2] == (names, False)


def test_list_basins_leaves_out_buckets_whose_names_s2_refuses(c):
    """S2 clients refuse a whole listing holding one name S2 would not accept."""
    prefix = f"l{uuid.uuid4().hex[:10]}"
    check(c.put(f"/{prefix}_under"), 201)
    Basin.create(c, f"{prefix}-ok")
    assert listing(c, prefix=prefix)[:2] == ([f"{prefix}-ok"], False)


def test_list_basins_with_a_bad_limit_is_400_bad_query(c):
    expect_error(c.get("/v1/basins", params={"limit": "many"}), 400, "bad_query")


# --- delete -------------------------------------------------------------------------

def test_delete_basin_is_202_and_the_basin_is_gone(c):
    b = Basin.create(c)
    check(c.delete(basin_path(b.name)), 202)
    expect_error(c.get(basin_path(b.name)), 404, "basin_not_found")
    assert b.name not in listing(c, prefix=b.name)[0]
    check(c.get(f"/{b.name}"), 404)


def test_delete_basin_removes_all_its_streams_on_both_faces(c):
    b = Basin.create(c)
    for name in ("one", "two"):
        b.create_stream(name)
        b.ack(name, ["data"])
    check(c.delete(basin_path(b.name)), 202)
    for name in ("one", "two"):
        expect_error(c.get(s2.tail_path(name), headers=b.headers()), 404, "basin_not_found")
        check(c.get(s2.ds_path(b.name, name), params={"offset": "-1"}), 404)


def test_basin_recreated_after_delete_starts_empty(c):
    b = Basin.create(c)
    b.create_stream("old")
    check(c.delete(basin_path(b.name)), 202)
    Basin.create(c, b.name)
    assert json_of(c.get("/v1/streams", headers=b.headers()))["streams"] == []
    expect_error(c.get(s2.tail_path("old"), headers=b.headers()), 404, "stream_not_found")


def test_a_basin_delete_that_cannot_finish_leaves_the_basin_taking_streams(c):
    # A stream that a fork in another basin still reads stays (soft-deleted) in its basin.
    b, other = Basin.create(c), Basin.create(c)
    b.create_stream("read-by-a-fork")
    check(c.put(s2.ds_path(other.name, "fork"), headers={
        "content-type": "application/octet-stream",
        "stream-forked-from": s2.ds_path(b.name, "read-by-a-fork")}), 201)
    check(c.delete(basin_path(b.name)), 409)
    b.create_stream("after")
    b.ack("after", ["still usable"])


def test_delete_missing_basin_is_404_basin_not_found(c):
    expect_error(c.delete(basin_path(unique_basin())), 404, "basin_not_found")


# --- basins are buckets -----------------------------------------------------------

def test_basin_created_through_s2_is_a_durable_streams_bucket(c, basin, stream):
    got = json_of(c.get(f"/{basin.name}"))
    assert got.get("bucket_id") == basin.name
    listed = json_of(c.get(f"/{basin.name}/streams"))
    assert [s["stream_id"] for s in listed["streams"]] == [stream]


def test_bucket_created_through_put_is_usable_as_a_basin(c):
    bucket = f"b_{uuid.uuid4().hex[:10]}"  # a bucket id, not an S2 basin name
    check(c.put(f"/{bucket}"), 201)
    b = Basin(c, bucket)
    json_of(c.get(basin_path(bucket)))
    stream = b.create_stream()
    ack = b.ack(stream, ["via s2"])
    assert ack["end"]["seq_num"] == 1
    assert s2.bodies(b.records(stream, seq_num=0)) == ["via s2"]
    assert [s["name"] for s in json_of(c.get("/v1/streams", headers=b.headers()))["streams"]] \
        == [stream]
