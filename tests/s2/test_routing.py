"""Routing of the S2 face: the basin comes from the `s2-basin` header, or else
from a `{basin}.` prefix of the Host header; with neither it is 400
`bad_header`. Missing basins and streams are 404 with S2's codes. Access
tokens are not implemented (501)."""

import pytest

import s2lib as s2
from s2lib import Basin, check, expect_error, json_of, records_path, stream_path, tail_path, unique_basin


def host_for(server, basin=None):
    """A Host header naming `basin` as the first label (or no basin: localhost)."""
    return f"{basin}.localhost:{server.port}" if basin else f"localhost:{server.port}"


# --- s2-basin header ------------------------------------------------------------------

def test_s2_basin_header_selects_the_basin(c, basin, stream):
    basin.ack(stream, ["hello"])
    assert s2.bodies(basin.records(stream, seq_num=0)) == ["hello"]


def test_same_stream_name_in_two_basins_is_two_streams(c):
    a, b = Basin.create(c), Basin.create(c)
    name = "shared-name"
    a.create_stream(name)
    b.create_stream(name)
    a.ack(name, ["in a"])
    b.ack(name, ["in b1", "in b2"])
    assert s2.bodies(a.records(name, seq_num=0)) == ["in a"]
    assert s2.bodies(b.records(name, seq_num=0)) == ["in b1", "in b2"]


# --- Host prefix ----------------------------------------------------------------------

def test_host_prefix_selects_the_basin_without_s2_basin_header(c, server, basin, stream):
    host = {"host": host_for(server, basin.name)}
    r = c.post(records_path(stream), json={"records": [{"body": "via host"}]}, headers=host)
    ack = json_of(r)
    assert ack["start"]["seq_num"] == 0 and ack["end"]["seq_num"] == 1
    body = json_of(c.get(records_path(stream), params={"seq_num": 0}, headers=host))
    assert s2.bodies(body["records"]) == ["via host"]
    tail = json_of(c.get(tail_path(stream), headers=host))
    assert tail["tail"]["seq_num"] == 1


def test_host_prefix_works_for_stream_management(c, server, basin):
    host = {"host": host_for(server, basin.name)}
    json_of(c.post("/v1/streams", json={"stream": "by-host"}, headers=host), 201)
    names = [s["name"] for s in json_of(c.get("/v1/streams", headers=host))["streams"]]
    assert names == ["by-host"]
    json_of(basin.c.get(stream_path("by-host"), headers=basin.headers()))


def test_s2_basin_header_wins_over_host_prefix(c, server):
    by_header, by_host = Basin.create(c), Basin.create(c)
    by_header.create_stream("x")
    by_host.create_stream("x")
    headers = {"host": host_for(server, by_host.name), "s2-basin": by_header.name}
    json_of(c.post(records_path("x"), json={"records": [{"body": "to header basin"}]},
                   headers=headers))
    assert by_header.tail("x")["seq_num"] == 1
    assert by_host.tail("x")["seq_num"] == 0


def test_host_prefix_naming_a_missing_basin_is_404_basin_not_found(c, server):
    host = {"host": host_for(server, unique_basin())}
    expect_error(c.get(tail_path("x"), headers=host), 404, "basin_not_found")


# --- neither ------------------------------------------------------------------------------

@pytest.mark.parametrize("method,path", [
    ("GET", records_path("x")),
    ("POST", records_path("x")),
    ("GET", tail_path("x")),
    ("GET", "/v1/streams"),
    ("POST", "/v1/streams"),
    ("GET", stream_path("x")),
    ("PUT", stream_path("x")),
    ("PATCH", stream_path("x")),
    ("DELETE", stream_path("x")),
])
def test_no_basin_header_and_no_host_prefix_is_400_bad_header(c, server, method, path):
    body = {"records": [{"body": "a"}]} if method == "POST" and path.endswith("records") else \
        {"stream": "x"} if method == "POST" else {} if method == "PATCH" else None
    r = c.request(method, path, json=body, headers={"host": host_for(server)})
    expect_error(r, 400, "bad_header")


# --- missing basin / stream ----------------------------------------------------------

@pytest.mark.parametrize("method,path", [
    ("GET", records_path("x")),
    ("POST", records_path("x")),
    ("GET", tail_path("x")),
    ("GET", "/v1/streams"),
    ("POST", "/v1/streams"),
    ("GET", stream_path("x")),
])
def test_unknown_basin_is_404_basin_not_found(c, method, path):
    body = {"records": [{"body": "a"}]} if method == "POST" and path.endswith("records") else \
        {"stream": "x"} if method == "POST" else None
    r = c.request(method, path, json=body, headers={"s2-basin": unique_basin()})
    expect_error(r, 404, "basin_not_found")


@pytest.mark.parametrize("method,path", [
    ("GET", records_path("nope")),
    ("POST", records_path("nope")),
    ("GET", tail_path("nope")),
    ("GET", stream_path("nope")),
    ("PATCH", stream_path("nope")),
    ("DELETE", stream_path("nope")),
])
def test_unknown_stream_is_404_stream_not_found(c, basin, method, path):
    body = {"records": [{"body": "a"}]} if method == "POST" else {} if method == "PATCH" else None
    r = c.request(method, path, json=body, headers=basin.headers())
    expect_error(r, 404, "stream_not_found")


def test_unknown_stream_sse_read_is_a_plain_404_not_an_event(c, basin):
    with basin.sse("nope", seq_num=0) as s:
        expect_error(s.response, 404, "stream_not_found")


# --- stream names --------------------------------------------------------------------

def test_stream_name_is_one_percent_decoded_path_segment(c, basin):
    name = "a b%c+é:~"
    basin.create_stream(name)
    basin.ack(name, ["odd name"])
    assert s2.bodies(basin.records(name, seq_num=0)) == ["odd name"]
    names = [s["name"] for s in json_of(c.get("/v1/streams", headers=basin.headers()))["streams"]]
    assert names == [name]


def test_stream_name_of_512_bytes_is_accepted(c, basin):
    name = "n" * 512
    json_of(c.put(stream_path(name), headers=basin.headers()), 201)
    basin.ack(name, ["max"])


@pytest.mark.parametrize("method", ["PUT", "GET", "DELETE"])
def test_stream_name_over_512_bytes_is_400_bad_path(c, basin, method):
    name = "n" * 513
    expect_error(c.request(method, stream_path(name), headers=basin.headers()), 400, "bad_path")


@pytest.mark.parametrize("name", ["a\x00b", ".", ".."])
@pytest.mark.parametrize("route", ["ensure", "append", "read", "tail"])
def test_stream_name_with_nul_or_dot_or_dotdot_is_400_bad_path(c, basin, name, route):
    if route == "ensure":
        r = c.put(stream_path(name), headers=basin.headers())
    elif route == "append":
        r = basin.post(name, {"records": [{"body": "a"}]})
    elif route == "read":
        r = c.get(records_path(name), params={"seq_num": 0}, headers=basin.headers())
    else:
        r = c.get(tail_path(name), headers=basin.headers())
    expect_error(r, 400, "bad_path")


@pytest.mark.parametrize("name", ["users/42/events", "a..b", "x.."])
def test_s2_names_beyond_the_bucket_id_rule_are_s2_only_streams(c, basin, name):
    """S2 allows '/' and '..' inside names; such a stream is served through S2, while the
    bucketed Durable Streams surface (whose ids allow neither) cannot address it."""
    json_of(c.put(stream_path(name), headers=basin.headers()), 201)
    basin.ack(name, ["deep"])
    assert s2.bodies(basin.records(name, seq_num=0)) == ["deep"]
    listed = [s["name"] for s in json_of(c.get("/v1/streams", headers=basin.headers()))["streams"]]
    assert name in listed


def test_stream_create_body_with_invalid_name_is_400_bad_path(c, basin):
    r = c.post("/v1/streams", json={"stream": ".."}, headers=basin.headers())
    expect_error(r, 400, "bad_path")
    assert json_of(c.get("/v1/streams", headers=basin.headers()))["streams"] == []


# --- not implemented -----------------------------------------------------------------

def test_access_tokens_are_issued_listed_and_revoked(c):
    """Without --auth every caller is the operator; tokens still round-trip (tests/it/auth.rs checks
    what they permit with --auth on)."""
    scope = {"basins": {"prefix": ""}, "streams": {"prefix": ""}, "op_groups": {"stream": {"read": True}}}
    issued = json_of(c.post("/v1/access-tokens", json={"id": "tok-1", "scope": scope}), 201)
    assert issued["access_token"]
    listed = json_of(c.get("/v1/access-tokens"), 200)["access_tokens"]
    assert [t["id"] for t in listed] == ["tok-1"]
    assert issued["access_token"] not in str(listed)
    expect_error(c.post("/v1/access-tokens", json={"id": "tok-1", "scope": scope}), 409,
                 "resource_already_exists")
    json_of(c.delete("/v1/access-tokens/tok-1"), 200)
    expect_error(c.delete("/v1/access-tokens/tok-1"), 404, "access_token_not_found")


@pytest.mark.parametrize("path", ["/v1/metrics", "/v1/metrics/some-basin", "/v1/metrics/some-basin/s",
                                  "/v1/locations", "/v1/locations/default"])
def test_usage_metrics_and_locations_are_501_not_implemented(c, path):
    for method in ("GET", "PUT"):
        expect_error(c.request(method, path), 501, "not_implemented")


def test_s2_routes_do_not_shadow_durable_streams_buckets(c, basin, stream):
    # /v1/... is the S2 face; a bucket listing of the basin is still served on /{bucket}.
    check(c.get(f"/{basin.name}"), 200)


# --- CORS -----------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/v1/basins", "/v1/streams", "/v1/streams/s/records",
                                  "/v1/streams/s/records/tail", "/v1/access-tokens"])
def test_a_cors_preflight_on_an_s2_route_allows_the_s2_headers(c, path):
    r = c.options(path, headers={"origin": "https://app.example",
                                 "access-control-request-method": "POST",
                                 "access-control-request-headers": "authorization, s2-basin"})
    assert r.status_code == 204, r.text
    assert r.headers["access-control-allow-origin"] == "*"
    assert "POST" in r.headers["access-control-allow-methods"]
    allowed = r.headers["access-control-allow-headers"].lower()
    assert "s2-basin" in allowed and "authorization" in allowed
