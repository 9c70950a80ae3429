"""What phones can hold (issue #36, docs/agent.md "What the phone holds", docs/protocol.md):
the agent reports its memory, its models folder's free storage, the model files there with
their SHA-256 (worked out once per file, off the event loop, and kept by size and time) and
what it loads; the gateway keeps them and shows them in its admin API; it checks what a
phone says; and a phone that cannot hold its model says so once (state "unfit"), listed
with the refused registrations when it speaks for the fleet, and exits 3."""
import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import requests

import fleet
import gwutil as g
from fleet import HOST, T

SECRET = "hold-test-fleet-secret-0123"
ADMIN_TOKEN = "hold-test-admin-token-0123"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
HB = "/fleet/v1/heartbeat"


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def gw_cfg(ports):
    c = g.gw_config(ports[0], [])
    c["fleet"] = {"secret_env": "FG_HOLD_SECRET", "heartbeat_timeout_s": 30}
    c["admin"] = {"listen": f"{HOST}:{ports[1]}", "token": ADMIN_TOKEN}
    return c


def start_gateway(gateway):
    gw = gateway(gw_cfg, n_ports=2, env={"FG_HOLD_SECRET": SECRET})
    gw.admin_url = f"http://{HOST}:{gw.ports[1]}"
    return gw


def admin(gw, path):
    r = requests.get(gw.admin_url + path, headers=ADMIN, timeout=T(5))
    assert r.status_code == 200, r.text
    return r.json() if path != "/metrics" else r.text


def replica(gw, id):
    return {x["id"]: x for x in admin(gw, "/admin/v1/replicas")["replicas"]}.get(id)


def phone_root(path, mem_total_kb):
    (path / "proc").mkdir(parents=True, exist_ok=True)
    (path / "proc/meminfo").write_text(f"MemTotal: {mem_total_kb} kB\nMemFree: 100000 kB\n"
                                       f"MemAvailable: {mem_total_kb // 3} kB\n")
    return path


def models_folder(path):
    """Two model files and things that are not model files."""
    path.mkdir()
    files = {"small.gguf": b"s" * 1000, "large-q4.gguf": os.urandom(5 << 20)}
    for name, data in files.items():
        (path / name).write_bytes(data)
    (path / "notes.txt").write_text("not a model")
    (path / "half.gguf.part").write_bytes(b"a download under way")
    return {name[:-5]: sha256(data) for name, data in files.items()}


def test_sim_agent_status_lists_the_models_on_its_disk_once_checked(procs, sim, tmp_path):
    folder = tmp_path / "models"
    want = models_folder(folder)
    root = phone_root(tmp_path / "root", 11534336)
    d = sim(extra_args=("--models-dir", str(folder)), env={"FLEETGATE_AGENT_SYSROOT": str(root)})

    def status():
        return requests.get(d.url + "/agent/v1/status", timeout=T(5)).json()

    def checked():
        s = status()
        return s if s["held"] and all(h["sha256"] for h in s["held"]) else None
    assert fleet.wait_until(checked, T(10)), status()
    s = checked()
    assert s["models_dir"] == str(folder)
    assert [(h["name"], h["file"], h["sha256"]) for h in s["held"]] == [
        ("large-q4", "large-q4.gguf", want["large-q4"]), ("small", "small.gguf", want["small"])]
    assert s["held"][0]["bytes"] == 5 << 20
    assert s["device"]["mem_total_mb"] == 11264 and s["device"]["storage_free_mb"] > 0
    assert s["loading"] is None
    # worked out once: kept in the folder's cache, so a new agent reads neither file again
    cache = (folder / ".fleetgate-sha256").read_text()
    assert want["large-q4"] in cache and want["small"] in cache
    assert len(re.findall(r'"msg":"model file digest"', Path(d.stderr_path).read_text())) == 2
    d.stop()
    d2 = sim(extra_args=("--models-dir", str(folder)), name="again")
    assert fleet.wait_until(lambda: requests.get(d2.url + "/agent/v1/status", timeout=T(5)).json()["held"], T(10))
    held = requests.get(d2.url + "/agent/v1/status", timeout=T(5)).json()["held"]
    assert [h["sha256"] for h in held] == [want["large-q4"], want["small"]]
    assert '"msg":"model file digest"' not in Path(d2.stderr_path).read_text()


def test_gateway_keeps_what_an_agent_says_it_holds(procs, gateway, tmp_path):
    gw = start_gateway(gateway)
    folder = tmp_path / "models"
    want = models_folder(folder)
    root = phone_root(tmp_path / "root", 7654321)
    procs.spawn("phone", lambda ports: fleet.sim_argv(
        ports[0], id="phone-h", extra_args=("--gateway", gw.url, "--public-url", f"http://{HOST}:{ports[0]}",
                                            "--models-dir", str(folder), "--sysfs-root", str(root))),
        env={"FLEETGATE_FLEET_SECRET": SECRET})

    def held():
        r = replica(gw, "phone-h")
        return r if r and r["held"] and len(r["held"]) == 2 else None
    assert fleet.wait_until(held, T(20)), replica(gw, "phone-h")
    r = held()
    assert r["held"] == [{"name": "large-q4", "sha256": want["large-q4"]}, {"name": "small", "sha256": want["small"]}]
    assert r["mem_total_mb"] == 7474 and r["storage_free_mb"] > 0 and r["loading"] is None
    # the status page's data carries them too
    page = {x["id"]: x for x in admin(gw, "/admin/v1/status")["replicas"]}["phone-h"]
    assert page["held"] == r["held"] and page["mem_total_mb"] == 7474


def hb(gw, body, secret=SECRET, key=None):
    raw, h = g.heartbeat_headers(body, secret=secret, key=key)
    return requests.post(gw.url + HB, data=raw, timeout=T(5), headers=h)


def test_heartbeats_say_what_a_phone_holds_and_bad_lists_are_refused(procs, gateway):
    gw = start_gateway(gateway)
    phone = g.ScriptedPhone({"choices": []}, id="phone-x")
    try:
        base = {"id": "phone-x", "url": phone.url, "models": ["qwen3.5-9b"], "slots": 1, "state": "ready",
                "device": {"mem_total_mb": 11264, "storage_free_mb": 40211, "some_future_reading": 1}}
        good = dict(base, held=[{"name": "qwen3.5-9b", "sha256": "ab" * 32}], loading="qwen3.5-0.8b")
        r = hb(gw, good)
        assert r.status_code == 200, r.text
        rep = replica(gw, "phone-x")
        assert rep["held"] == [{"name": "qwen3.5-9b", "sha256": "ab" * 32}]
        assert rep["loading"] == "qwen3.5-0.8b" and rep["mem_total_mb"] == 11264 and rep["storage_free_mb"] == 40211
        bad = [
            dict(base, held=[{"name": "qwen3.5-9b", "sha256": "AB" * 32}]),        # not lowercase
            dict(base, held=[{"name": "a model", "sha256": "ab" * 32}]),           # a space
            dict(base, held=[{"name": "m", "sha256": "ab" * 31}]),                 # short
            dict(base, held=[{"name": "m", "sha256": "ab" * 32, "bytes": 5}]),     # an unknown key
            dict(base, held=[{"name": f"m{i}", "sha256": "ab" * 32} for i in range(17)]),  # too many
            dict(base, held="qwen3.5-9b"),
            dict(base, loading="x" * 65),
            dict(base, unfit="no state unfit"),
        ]
        for body in bad:
            r = hb(gw, body)
            assert r.status_code == 400, (body, r.text)
            assert r.json()["error"]["code"] == "invalid_heartbeat", r.text
        # none of them changed what the gateway knew
        rep = replica(gw, "phone-x")
        assert rep["held"] == [{"name": "qwen3.5-9b", "sha256": "ab" * 32}] and rep["loading"] == "qwen3.5-0.8b"
        # a heartbeat without them: an agent that does not say (unknown), nothing loading;
        # a device reading left out keeps its last value
        fleet.wait_until(lambda: False, 1.1)  # heartbeats of one phone are spaced (429 heartbeat_rate)
        r = hb(gw, dict(base, device={}))
        assert r.status_code == 200, r.text
        rep = replica(gw, "phone-x")
        assert rep["held"] is None and rep["loading"] is None and rep["mem_total_mb"] == 11264
    finally:
        phone.close()


def unfit_body(id, why="cannot hold qwen3.5-9b: it needs 7013 MiB of memory and this phone can give it 5426 MiB"):
    return {"id": id, "models": ["qwen3.5-9b"], "slots": 1, "state": "unfit", "unfit": why,
            "device": {"mem_total_mb": 7474}}


def test_a_phone_that_cannot_hold_its_model_is_listed_when_it_speaks_for_the_fleet(procs, gateway):
    gw = start_gateway(gateway)

    def refused():
        return admin(gw, "/admin/v1/status")["refused_registrations"]

    # with the fleet secret: listed (no url), nothing pinned or registered
    r = hb(gw, unfit_body("small-1"))
    assert r.status_code == 200, r.text
    assert r.json() == {"id": "small-1", "accepted": False, "state": "unfit"}
    (e,) = refused()
    assert e["id"] == "small-1" and e["url"] == ""
    assert e["reason"] == "cannot_hold: cannot hold qwen3.5-9b: it needs 7013 MiB of memory and this phone can give it 5426 MiB"
    assert admin(gw, "/admin/v1/replicas")["replicas"] == []
    assert admin(gw, "/admin/v1/enrolments")["enrolments"] == []
    # strangers are not listed: no fleet secret, a wrong one
    assert hb(gw, unfit_body("small-2"), secret=None).status_code == 401
    assert hb(gw, unfit_body("small-3"), secret="not-the-fleet-secret-0123").status_code == 401
    # an enrolled phone speaks with its own key, without the fleet secret
    key = g.PhoneKey()
    phone = g.ScriptedPhone({"choices": []}, id="big-1")
    try:
        r = hb(gw, {"id": "big-1", "url": phone.url, "models": ["m"], "slots": 1}, key=key)
        assert r.status_code == 200, r.text
        raw, h = g.heartbeat_headers(unfit_body("big-1", "cannot hold m: its file needs 900 MiB more of storage"),
                                     key=key)
        r = requests.post(gw.url + HB, data=raw, headers=h, timeout=T(5))
        assert r.status_code == 200, r.text
        # its replica goes down at once, saying why; the same report again is a replay
        rep = replica(gw, "big-1")
        assert rep["health"] == "down" and "its phone cannot hold its model: cannot hold m" in rep["reason"], rep
        r = requests.post(gw.url + HB, data=raw, headers=h, timeout=T(5))
        assert r.status_code == 401 and r.json()["error"]["code"] == "replayed_heartbeat", r.text
        # another key for that id is not it, fleet secret or not
        r = hb(gw, unfit_body("big-1", "someone else"), key=g.PhoneKey())
        assert r.status_code == 401 and r.json()["error"]["code"] == "key_mismatch", r.text
    finally:
        phone.close()
    assert [(x["id"], x["reason"]) for x in refused()] == [
        ("big-1", "cannot_hold: cannot hold m: its file needs 900 MiB more of storage"),
        ("small-1", "cannot_hold: cannot hold qwen3.5-9b: it needs 7013 MiB of memory and this phone can give it 5426 MiB")]
    assert 'fleetgate_registrations_refused_total{reason="cannot_hold"} 2' in admin(gw, "/metrics")
    # a report is no enrolment: the id is still free for a phone that can hold the model
    r = hb(gw, {"id": "small-1", "url": "http://127.0.0.1:9/", "models": ["m"], "slots": 1}, key=g.PhoneKey())
    assert r.status_code == 200, r.text
    # and a report names a reason, and only with state unfit
    assert hb(gw, dict(unfit_body("small-4"), unfit="")).status_code == 400
    assert hb(gw, dict(unfit_body("small-4"), state="ready")).status_code == 400  # then a url is needed


def agent(*args, env=None):
    return subprocess.run([fleet.agent_bin(), *[str(a) for a in args]], capture_output=True, text=True,
                          timeout=T(30), stdin=subprocess.DEVNULL, env=dict(os.environ, **(env or {})))


def test_hold_check_exits_3_on_a_phone_too_small_and_tells_the_gateway(procs, gateway, tmp_path):
    small = phone_root(tmp_path / "small", 7654321)   # an 8 GB phone
    big = phone_root(tmp_path / "big", 11534336)      # a 12 GB phone
    folder = tmp_path / "models"
    folder.mkdir()
    common = ("--hold-check", "--model", "qwen3.5-9b", "--model-file", folder / "qwen3.5-9b.gguf",
              "--model-bytes", 5680000000)
    p = agent(*common, "--sysfs-root", small)
    assert p.returncode == 3, p.stderr
    assert "cannot hold qwen3.5-9b: it needs 7013 MiB of memory and this phone can give it 5426 MiB" in p.stderr
    p = agent(*common, "--sysfs-root", big)
    assert p.returncode == 0, p.stderr
    assert "qwen3.5-9b fits: 7013 of 8448 MiB of memory" in p.stderr
    # --need-mem-mb says it outright
    assert agent(*common, "--sysfs-root", big, "--need-mem-mb", 9000).returncode == 3
    # with --gateway: said once to the gateway, then exit 3
    gw = start_gateway(gateway)
    p = agent(*common, "--sysfs-root", small, "--id", "acu-small-1", "--gateway", gw.url,
              env={"FLEETGATE_FLEET_SECRET": SECRET})
    assert p.returncode == 3, p.stderr
    assert "the gateway took the report" in p.stderr
    (e,) = admin(gw, "/admin/v1/status")["refused_registrations"]
    assert e["id"] == "acu-small-1" and e["reason"].startswith("cannot_hold: cannot hold qwen3.5-9b: it needs 7013")
    # what it needs to be told
    for args, said in [(("--hold-check", "--model-file", folder / "m.gguf"), "--model-bytes or --need-mem-mb"),
                       (("--hold-check", "--model-bytes", 10), "--model-file or --models-dir"),
                       (common + ("--gateway", gw.url), "needs --id and --model"),
                       (common + ("--model-bytes", 0), "--model-bytes"),
                       (common + ("--id", "x", "--gateway", gw.url, "--public-url", "http://127.0.0.1:9"),
                        "--hold-check opens no tunnel")]:
        p = agent(*args, env={"FLEETGATE_FLEET_SECRET": SECRET})
        assert p.returncode == 1 and said in p.stderr, (args, p.stderr)
    assert not list(folder.iterdir())  # a check downloads nothing
