"""Placement and what a phone can hold (issue #36, docs/placement.md): a phone whose models
folder has too little free storage for a catalogue model is not sent to it (the gateway
reads the storage its heartbeats say, and the admin API says why), and an agent asked for a
switch it cannot hold refuses it at once, before it drains or downloads anything, with the
reason in its heartbeats, and goes on serving its model."""
import concurrent.futures
import http.server
import json
import threading
import time

import pytest
import requests

import fleet
import llama
from fleet import HOST, T, wait_until
from test_placement import ADMIN, GUARD, MB, REVIEW, admin, chat, events, replicas, start

SECRET = "placement-fleet-secret-0123"


def test_a_phone_without_room_for_a_model_is_not_sent_to_it(procs, gateway, tmp_path):
    """Two phones on the guards; the faster one's models folder has 1,000 MiB free, the 9B's
    file is 9,000 MiB. Reviews arrive: the slow phone goes to the 9B (without the storage
    check the fast one would go first, and fail), every request is answered, and the admin
    API says why the fast one may not run the 9B; an operator's pin is refused likewise."""
    phones = [{"id": "fast-1", "prefill_tps": 4000, "decode_tps": 200, "storage_free_mb": 1000},
              {"id": "slow-1", "prefill_tps": 800, "decode_tps": 40, "storage_free_mb": 50000}]
    g, _ = start(procs, gateway, tmp_path, phones)
    assert wait_until(lambda: replicas(g)["fast-1"]["storage_free_mb"] == 1000, T(10)), replicas(g)
    prompt = fleet.make_prompt(1500, tag="review")
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        guards = ex.map(lambda i: chat(g, GUARD, f"guard {i}"), range(8))
        reviews = list(ex.map(lambda i: chat(g, REVIEW, f"{i} {prompt}", max_tokens=16), range(16)))
        guards = list(guards)
    bad = [r.text[:200] for r in reviews + guards if r.status_code != 200]
    assert not bad, bad
    assert {r.headers["x-fleetgate-replica"] for r in reviews} == {"slow-1"}
    switches = events(g, "placement_switch")
    assert [(e["replica"], e["to"]) for e in switches] == [("slow-1", REVIEW)], switches
    assert not events(g, "placement_switch_failed")
    pl = {p["id"]: p for p in admin(g, "/admin/v1/placements")["phones"]}
    assert pl["fast-1"]["may_not_run"] == {
        REVIEW: "its models folder has 1000 MiB free and the model's file needs 9000 MiB (with 256 to spare)"}, pl
    assert pl["fast-1"]["models"] == [GUARD] and pl["fast-1"]["last_failure"] is None
    # the download took its room on the slow phone: 50000 - 9000 MiB left
    assert wait_until(lambda: replicas(g)["slow-1"]["storage_free_mb"] == 41000, T(10)), replicas(g)
    r = requests.post(g.admin_url + "/admin/v1/placements/pin", headers=ADMIN,
                      json={"replica": "fast-1", "model": REVIEW}, timeout=T(5))
    assert r.status_code == 400 and "models folder has 1000 MiB free" in r.json()["error"]["message"], r.text


class FakeGateway:
    """Answers every heartbeat with `place` (the 9B) and keeps what the phone said."""

    def __init__(self, place):
        self.bodies = []
        me = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                me.bodies.append(json.loads(raw))
                out = json.dumps({"accepted": True, "interval_s": 0.2, "replica_token": "tok-" + "x" * 24,
                                  "place": place}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = http.server.ThreadingHTTPServer((HOST, 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{HOST}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_an_agent_refuses_a_switch_it_cannot_hold_before_it_drains(procs, tmp_path):
    """The gateway's word is not taken blindly: a phone asked for the 9B with 1,000 MiB free
    refuses at once, says why in its next heartbeat, never drains and answers every request
    meanwhile; a phone with room goes through with the same switch."""
    place = {"model": REVIEW, "url": "http://127.0.0.1:9/review.gguf", "sha256": "ab" * 32,
             "size_bytes": 9000 * MB, "mem_mb": 11312, "reason": "a test"}
    fake = FakeGateway(place)
    auth = {"Authorization": "Bearer tok-" + "x" * 24}

    def phone(name, storage):
        return procs.spawn(name, lambda ports: fleet.sim_argv(
            ports[0], model=GUARD, id=name, time_scale=5, extra_args=(
                "--model-bytes", str(800 * MB), "--gateway", fake.url, "--public-url", f"http://{HOST}:{ports[0]}",
                "--sim-storage-free-mb", str(storage), "--sim-fetch-mb-s", "1000")),
            env={"FLEETGATE_FLEET_SECRET": SECRET})
    small = phone("small", 1000)

    def said(pid, phase):
        return [b for b in fake.bodies if b["id"] == pid and (b.get("switch") or {}).get("phase") == phase]
    assert wait_until(lambda: said("small", "failed"), T(10)), fake.bodies[-3:]
    sw = said("small", "failed")[0]["switch"]
    assert sw == {"to": REVIEW, "phase": "failed",
                  "why": "cannot hold review-9b: its file needs 9000 MiB more of storage in the models folder "
                         "(with 256 MiB to spare) and 1000 MiB are free"}, sw
    url = f"http://{HOST}:{small.ports[0]}"
    for i in range(10):
        r = requests.post(url + "/v1/chat/completions", json=fleet.chat_body(f"hi {i}", model=GUARD),
                          headers=auth, timeout=T(10))
        assert r.status_code == 200 and r.json()["model"] == GUARD, r.text
        time.sleep(0.05)
    mine = [b for b in fake.bodies if b["id"] == "small"]
    assert all(b["state"] == "ready" and b["models"] == [GUARD] for b in mine), mine[-1]
    assert not said("small", "draining") and not said("small", "fetching")
    assert mine[-1]["device"]["storage_free_mb"] == 1000
    # with room, the same word is followed
    phone("roomy", 20000)
    assert wait_until(lambda: [b for b in fake.bodies if b["id"] == "roomy" and b["models"] == [REVIEW]
                               and b["state"] == "ready"], T(20)), [b for b in fake.bodies if b["id"] == "roomy"][-2:]
    assert said("roomy", "fetching") and not said("roomy", "failed")


def test_an_agent_with_llama_server_refuses_a_switch_it_cannot_hold(procs, tmp_path):
    """The same on an agent that starts the real llama-server: asked for a model whose file
    is larger than any disk here, it refuses before it drains (the engine is not restarted,
    nothing is downloaded), says why, and its engine answers throughout."""
    try:
        eng = llama.prepare(tmp_path / "engine")
    except llama.EngineMissing as e:
        if llama.in_ci():
            raise
        pytest.skip(str(e))
    models = tmp_path / "models"
    models.mkdir()
    (models / "guard-tiny.gguf").write_bytes(eng.model.read_bytes())
    huge = 900 * 10**12  # 900 TB
    fake = FakeGateway({"model": "huge-tiny", "url": "http://127.0.0.1:9/huge-tiny.gguf", "sha256": "ab" * 32,
                        "size_bytes": huge, "reason": "a test"})

    def argv(ports):
        conf = {"command": str(eng.bin), "upstream": f"http://{HOST}:{ports[1]}", "restart_max_s": 2,
                "ready_timeout_s": 60, "stop_timeout_s": 5,
                "args": llama.args(eng, ports[1], slots=1, alias="guard-tiny")}
        conf["args"][1] = str(models / "guard-tiny.gguf")
        path = tmp_path / "agent.json"
        path.write_text(json.dumps(conf))
        return [fleet.agent_bin(), "--engine", "llama", "--listen", f"{HOST}:{ports[0]}", "--config", str(path),
                "--id", "real-1", "--model", "guard-tiny", "--models-dir", str(models),
                "--gateway", fake.url, "--public-url", f"http://{HOST}:{ports[0]}"]
    a = procs.spawn("agent", argv, n_ports=2, env={"FLEETGATE_FLEET_SECRET": SECRET}, ready_timeout=60)

    def failed():
        return [b for b in fake.bodies if (b.get("switch") or {}).get("phase") == "failed"]
    assert wait_until(failed, T(60)), fake.bodies[-2:]
    why = failed()[0]["switch"]["why"]
    assert why.startswith("cannot hold huge-tiny: its file needs 858306885 MiB more of storage in the models "
                          "folder (with 256 MiB to spare) and "), why
    assert not [b for b in fake.bodies if (b.get("switch") or {}).get("phase") in ("draining", "fetching", "loading")]
    assert wait_until(lambda: fake.bodies[-1]["state"] == "ready", T(60)), fake.bodies[-1]
    r = requests.post(f"http://{HOST}:{a.ports[0]}/v1/chat/completions", timeout=T(30),
                      headers={"Authorization": "Bearer tok-" + "x" * 24},
                      json=fleet.chat_body("hello", model="guard-tiny", max_tokens=4))
    assert r.status_code == 200, r.text
    assert [p.name for p in models.iterdir() if not p.name.startswith(".")] == ["guard-tiny.gguf"]
    assert "switch to huge-tiny failed: cannot hold huge-tiny" in a.logs(100000)


def test_the_catalogue_example_checks(tmp_path):
    """config/placement.json, the example of a fleet placed by demand (docs/placement.md),
    passes --check-config as it is (with its secrets and data_dir); a mistake in its
    catalogue is found, with its position."""
    import shutil  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    src = fleet.SOURCE_ROOT / "config" / "placement.json"
    conf = json.loads(src.read_text())
    assert conf["placement"]["enabled"] and [m["name"] for m in conf["models"]] == [
        "qwen3.5-0.8b", "qwen3.5-4b", "qwen3.5-9b"]
    shutil.copy(src, tmp_path / "placement.json")
    (tmp_path / "placement-data").mkdir()
    env = {"PATH": "/usr/bin:/bin", "FLEETGATE_ADMIN_TOKEN": "a" * 8 + "0123456789abcdef",
           "FLEETGATE_FLEET_SECRET": "b" * 8 + "0123456789abcdef"}
    r = subprocess.run([str(fleet.gateway_bin()), "--check-config", "placement.json"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout == "placement.json: ok (0 replicas)\n", r.stdout + r.stderr
    del conf["models"][2]["sha256"]  # a url without its digest
    (tmp_path / "placement.json").write_text(json.dumps(conf, indent=1))
    r = subprocess.run([str(fleet.gateway_bin()), "--check-config", "placement.json"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "models[2]" in r.stderr and "sha256" in r.stderr, r.stderr


def test_hold_check_is_offered_a_catalogue_model_the_phone_can_hold(gateway, tmp_path):
    """`fleetgate-agent --hold-check` on an 8 GB phone for the 9B, against a gateway with
    placement: exit 4 and the model the gateway names instead on stdout, as the lines
    run.sh reads (docs/phones.md); without placement, exit 3 as before."""
    import subprocess  # noqa: PLC0415
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "proc/meminfo").write_text("MemTotal: 7654321 kB\nMemFree: 100000 kB\nMemAvailable: 2000000 kB\n")
    folder = tmp_path / "models"
    folder.mkdir()

    def cfg(ports, enabled, guard=None, fleet_over=None, replicas=None):
        c = {"listen": [{"address": f"{HOST}:{ports[0]}"}], "upstream": fleet.ALLOW_LOOPBACK,
             "fleet": dict({"secret_env": "FG_PLACE_SECRET"}, **(fleet_over or {})),
             "admin": {"listen": f"{HOST}:{ports[1]}", "token": "t" * 20},
             "models": [guard or {"name": GUARD, "url": "http://127.0.0.1:9/guard.gguf", "sha256": "cd" * 32,
                                  "size_bytes": 800 * MB, "n_ctx": 8192},
                        {"name": REVIEW, "url": "http://127.0.0.1:9/review.gguf", "sha256": "ab" * 32,
                         "size_bytes": 9000 * MB}],
             "placement": {"enabled": enabled}}
        if replicas:
            c["replicas"] = replicas
        return c

    def check(g):
        return subprocess.run([fleet.agent_bin(), "--hold-check", "--id", "acu-1", "--model", REVIEW, "--gateway", g.url,
                               "--models-dir", str(folder), "--model-bytes", str(9000 * MB), "--sysfs-root", str(root)],
                              capture_output=True, text=True, timeout=T(30), stdin=subprocess.DEVNULL,
                              env={"PATH": "/usr/bin:/bin", "FLEETGATE_FLEET_SECRET": SECRET})
    g = gateway(lambda p: cfg(p, True), n_ports=2, env={"FG_PLACE_SECRET": SECRET})
    p = check(g)
    assert p.returncode == 4, p.stderr
    assert p.stdout == (f"FG_MODEL={GUARD}\nFG_MODEL_URL=http://127.0.0.1:9/guard.gguf\nFG_MODEL_SHA256={'cd' * 32}\n"
                        f"FG_MODEL_BYTES={800 * MB}\nFG_NEED_MEM_MB=1472\nFG_CTX=8192\n"), p.stdout
    assert f"the gateway's placement gives this phone {GUARD} instead of {REVIEW}" in p.stderr
    g.stop()
    g = gateway(lambda p: cfg(p, False), n_ports=2, env={"FG_PLACE_SECRET": SECRET})
    p = check(g)
    assert p.returncode == 3 and p.stdout == "", (p.stdout, p.stderr)
    assert "the gateway took the report" in p.stderr
    assert not list(folder.iterdir())  # a check downloads nothing
    g.stop()

    # nothing is offered that the agent could not start on (and the phone is listed as
    # refused, not sent away unlisted): a model without its size, one whose name cannot
    # name a file, one whose url run.sh could not take as a value
    bad = ({"name": GUARD, "url": "http://127.0.0.1:9/guard.gguf", "sha256": "cd" * 32},
           {"name": "Qwen/guard 0.8B", "url": "http://127.0.0.1:9/guard.gguf", "sha256": "cd" * 32,
            "size_bytes": 800 * MB},
           {"name": GUARD, "url": "http://127.0.0.1:9/$guard.gguf", "sha256": "cd" * 32, "size_bytes": 800 * MB})
    for guard in bad:
        g = gateway(lambda p, guard=guard: cfg(p, True, guard=guard), n_ports=2, env={"FG_PLACE_SECRET": SECRET})
        p = check(g)
        assert p.returncode == 3 and p.stdout == "", (guard, p.stdout, p.stderr)
        (r,) = requests.get(f"http://{HOST}:{g.ports[1]}/admin/v1/status", headers={"Authorization": "Bearer " + "t" * 20},
                            timeout=T(5)).json()["refused_registrations"]
        assert r["reason"].endswith("; nor can it hold any other model of the catalogue"), (guard, r)
        g.stop()
    # nor to a phone not approved yet when enrolment asks an operator, nor to a phone of the
    # config file (placement never moves those)
    for over in ({"fleet_over": {"enrol": "approve"}},
                 {"replicas": [{"id": "acu-1", "url": "http://127.0.0.1:9", "models": [REVIEW]}]}):
        g = gateway(lambda p, over=over: cfg(p, True, **over), n_ports=2, env={"FG_PLACE_SECRET": SECRET})
        p = check(g)
        assert p.returncode == 3 and p.stdout == "", (over, p.stdout, p.stderr)
        g.stop()
