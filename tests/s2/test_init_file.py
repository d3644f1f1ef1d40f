"""`--init-file`: S2 basins and streams declared in s2-lite's JSON resource spec, created at
start, or brought to the configuration the file gives; a file that cannot be applied keeps the
server from starting, with a message saying what failed."""

import json
import os
import subprocess
import tempfile
from pathlib import Path

import runnel_harness as harness
import s2lib as s2
from s2lib import Basin, json_of, unique_basin


def spec_file(spec):
    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump(spec, f)
    f.close()
    return f.name


def test_declared_basins_and_streams_exist_with_their_configs_at_start(start_server):
    name = unique_basin()
    path = spec_file({"$schema": "ignored", "basins": [{
        "name": name,
        "config": {"create_stream_on_append": True,
                   "default_stream_config": {"retention_policy": "7d"}},
        "streams": [
            {"name": "audit", "config": {"retention_policy": "infinite",
                                         "delete_on_empty": {"min_age": "1h"},
                                         "timestamping": {"mode": "arrival"}}},
            {"name": "plain"},
        ],
    }]})
    srv = start_server("--init-file", path)
    c = srv.client()
    config = json_of(c.get(f"/v1/basins/{name}"))
    assert config["create_stream_on_append"] is True
    assert config["default_stream_config"]["retention_policy"] == {"age": 7 * 86400}
    basin = Basin(c, name)
    audit = basin.stream_config("audit")
    assert audit["retention_policy"] == {"infinite": {}}
    assert audit["delete_on_empty"] == {"min_age_secs": 3600}
    assert audit["timestamping"]["mode"] == "arrival"
    # "plain" takes the basin's default stream config, as any stream created in it would.
    assert basin.stream_config("plain")["retention_policy"] == {"age": 7 * 86400}

    # Applied again at the next start: what is there stays, records included.
    basin.ack("audit", ["kept"])
    srv.restart()
    assert s2.bodies(basin.records("audit", seq_num=0)) == ["kept"]
    assert basin.stream_config("audit")["delete_on_empty"] == {"min_age_secs": 3600}
    os.unlink(path)


def test_a_changed_file_reconfigures_what_exists(start_server):
    name = unique_basin()
    declared = {"basins": [{"name": name, "streams": [
        {"name": "s", "config": {"retention_policy": "1d"}}]}]}
    path = spec_file(declared)
    srv = start_server("--init-file", path)
    c = srv.client()
    assert Basin(c, name).stream_config("s")["retention_policy"] == {"age": 86400}
    declared["basins"][0]["streams"][0]["config"]["retention_policy"] = "2d"
    Path(path).write_text(json.dumps(declared))
    srv.restart()
    assert Basin(c, name).stream_config("s")["retention_policy"] == {"age": 2 * 86400}
    os.unlink(path)


def refused(spec_text, wanted):
    """Starts a server on a file that cannot be applied: it exits at once, saying why."""
    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    f.write(spec_text)
    f.close()
    path = f.name
    with tempfile.TemporaryDirectory() as data:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNEL_")}
        env["NO_COLOR"] = "1"
        done = subprocess.run(
            [harness.RUNNEL_BIN, "serve", "--listen", "127.0.0.1:0", "--data-dir", data,
             "--init-file", path],
            capture_output=True, text=True, timeout=30, env=env)
    os.unlink(path)
    assert done.returncode != 0, done.stdout
    assert wanted in done.stderr, done.stderr


def test_a_file_that_cannot_be_applied_keeps_the_server_from_starting(runnel_suite):
    runnel_suite.skip_if_external()
    name = unique_basin()
    refused("{", "is malformed")
    refused(json.dumps({"basins": [{"name": name}, {"name": name}]}), "declared twice")
    refused(json.dumps({"basins": [{"name": "UPPER-case-basin"}]}), "basin names are")
    refused(json.dumps({"basins": [{"name": name, "streams": [
        {"name": "s", "config": {"retention_policy": "soon"}}]}]}), "invalid duration")
    refused(json.dumps({"basins": [{"name": name, "streams": [
        {"name": "s", "config": {"retention_policy": "0s"}}]}]}), "retention age")
