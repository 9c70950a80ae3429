"""Models placed on phones by demand (issue #36, docs/placement.md): the gateway decides
which catalogue model each phone registered by heartbeat runs, tells its agent in the
heartbeat's answer, and the agent drains, downloads, loads and serves it. A mixed sim fleet
(two fast phones, two slow ones, all on the 0.8B guard model) sees demand move from guards
to a 9B review batch and back: the fast phones go to the 9B first, every request and batch
line is answered, and switches stay bounded (none under steady demand). A download whose
digest is wrong leaves the phone on its model, with the reason in the admin API."""
import concurrent.futures
import hashlib
import http.server
import json
import re
import threading
import time
import types

import pytest
import requests

import fleet
import llama
from fleet import HOST, T, wait_until

SECRET = "placement-fleet-secret-0123"
ADMIN_TOKEN = "placement-admin-token-0123"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
GUARD, REVIEW = "guard-0.8b", "review-9b"
MB = 1 << 20
SCALE = 5  # the sims' time scale: the gateway's load and download speeds are wall-clock
DIGEST = "ab" * 32


def gw_cfg(ports, data_dir, **placement):
    place = {"enabled": True, "interval_s": 0.3, "horizon_s": 30, "min_stay_s": 3,
             "hysteresis": 0.25, "max_switching": 0.5, "idle_s": 6,
             "load_mb_s": 2000 * SCALE, "fetch_mb_s": 1000 * SCALE}
    place.update(placement)
    return {
        "listen": [{"address": f"{HOST}:{ports[0]}"}],
        "upstream": dict(fleet.ALLOW_LOOPBACK, connect_timeout_s=2, timeout_min_s=10),
        "health": {"interval_s": 0.5, "timeout_s": 2, "rise": 1, "fall": 3, "readyz_counts": True},
        "queue": {"max": 2000, "timeout_s": 120},
        "scheduler": {"retries": 3, "default_max_tokens": 16},
        "fleet": {"secret_env": "FG_PLACE_SECRET", "heartbeat_timeout_s": 10,
                  "heartbeat_interval_s": 0.25},
        "admin": {"listen": f"{HOST}:{ports[1]}", "token": ADMIN_TOKEN},
        "data_dir": str(data_dir),
        "models": [
            {"name": GUARD, "url": "http://127.0.0.1:9/guard.gguf", "sha256": "cd" * 32,
             "size_bytes": 800 * MB},
            {"name": REVIEW, "url": "http://127.0.0.1:9/review.gguf", "sha256": DIGEST,
             "size_bytes": 9000 * MB, "n_ctx": 16384},
        ],
        "placement": place,
        "log_level": "info",
    }


def start(procs, gateway, tmp_path, phones, extra=(), **placement):
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    g = gateway(lambda p: gw_cfg(p, data, **placement), n_ports=2, env={"FG_PLACE_SECRET": SECRET})
    g.admin_url = f"http://{HOST}:{g.ports[1]}"
    f = tmp_path / "phones.json"
    f.write_text(json.dumps(phones))
    ports_file = tmp_path / "ports.json"
    argv = [fleet.agent_bin(), "--engine", "sim", "--listen", f"{HOST}:0", "--model", GUARD,
            "--slots", "2", "--time-scale", str(SCALE), "--model-bytes", str(800 * MB),
            "--sim-load-mb-s", "2000", "--sim-fetch-mb-s", "1000", "--id", "ph",
            "--phones-file", str(f), "--ports-file", str(ports_file),
            "--gateway", g.url, "--public-url", f"http://{HOST}:{{port}}", *extra]
    a = procs.spawn("phones", lambda ports: argv, n_ports=0, env={"FLEETGATE_FLEET_SECRET": SECRET},
                    ready=lambda d: ports_file.exists())
    assert wait_until(lambda: len(ready_on(g, GUARD)) == len(phones), T(20)), g.logs()
    return g, a


def admin(g, path):
    r = requests.get(g.admin_url + path, headers=ADMIN, timeout=T(5))
    assert r.status_code == 200, r.text
    return r.json()


def replicas(g):
    return {r["id"]: r for r in admin(g, "/admin/v1/replicas")["replicas"]}


def ready_on(g, model):
    return [i for i, r in replicas(g).items() if r["models"] == [model] and r["state"] in ("ready", "busy")]


def events(g, kind):
    return [e for e in admin(g, "/admin/v1/events?limit=1000").get("events", []) if e["type"] == kind]


def chat(g, model, content, max_tokens=8):
    return requests.post(g.url + "/v1/chat/completions",
                         json=fleet.chat_body(content, model=model, max_tokens=max_tokens),
                         timeout=T(150))


PHONES = [  # two fast phones, two slow ones (rates per simulated second)
    {"id": "fast-1", "prefill_tps": 4000, "decode_tps": 200},
    {"id": "fast-2", "prefill_tps": 4000, "decode_tps": 200},
    {"id": "slow-1", "prefill_tps": 800, "decode_tps": 40},
    {"id": "slow-2", "prefill_tps": 800, "decode_tps": 40},
]


def test_demand_moves_phones_to_the_batch_model_and_back(procs, gateway, tmp_path):
    g, _ = start(procs, gateway, tmp_path, PHONES)
    results, lock, stop = [], threading.Lock(), threading.Event()

    def guards(rate_s, max_tokens=4, prompt=""):
        i = 0
        while not stop.is_set():
            try:
                r = chat(g, GUARD, f"is this message safe? {i} {prompt}", max_tokens=max_tokens)
                got = (GUARD, r.status_code, r.headers.get("x-fleetgate-replica"), r.text[:200])
            except requests.RequestException as e:
                if stop.is_set():
                    return
                got = (GUARD, 0, None, str(e))
            with lock:
                results.append(got)
            i += 1
            time.sleep(rate_s)

    try:
        night_and_day(g, tmp_path, guards, results, stop)
    finally:
        stop.set()


def night_and_day(g, tmp_path, guards, results, stop):
    # day: guards only, steady: nothing moves (their answers long enough that the phones'
    # speeds are measured above the machine's noise)
    threads = [threading.Thread(target=guards, args=(0.05, 32), daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(T(5))
    assert events(g, "placement_switch") == [], "steady guard demand moved a phone"

    # night: a 9B review batch (long prompts) arrives, guards go on
    prompt = fleet.make_prompt(1500, tag="review")
    batch_in = tmp_path / "reviews.jsonl"
    batch_in.write_text("".join(json.dumps({
        "custom_id": f"rev-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": REVIEW, "messages": [{"role": "user", "content": f"{i} {prompt}"}],
                 "max_tokens": 16}}) + "\n" for i in range(24)))
    up = requests.post(g.url + "/v1/files", files={"file": ("reviews.jsonl", batch_in.read_bytes())},
                       data={"purpose": "batch"}, timeout=T(10))
    assert up.status_code == 200, up.text
    b = requests.post(g.url + "/v1/batches", json={"input_file_id": up.json()["id"],
                                                   "endpoint": "/v1/chat/completions",
                                                   "completion_window": "24h"}, timeout=T(10))
    assert b.status_code == 200, b.text
    with concurrent.futures.ThreadPoolExecutor(12) as ex:
        reviews = list(ex.map(lambda i: chat(g, REVIEW, f"{i} {prompt}", max_tokens=16), range(24)))
    assert all(r.status_code == 200 for r in reviews), [r.text[:200] for r in reviews if r.status_code != 200]
    assert {r.headers["x-fleetgate-replica"] for r in reviews} <= {p["id"] for p in PHONES}
    switches = events(g, "placement_switch")
    to_review = [e for e in sorted(switches, key=lambda e: e["id"]) if e["to"] == REVIEW]
    assert to_review, switches
    assert to_review[0]["replica"].startswith("fast-"), to_review  # fast phones first
    assert "no phone" in to_review[0]["reason"]

    def batch_done():
        st = requests.get(g.url + f"/v1/batches/{b.json()['id']}", timeout=T(5)).json()
        return st if st["status"] in ("completed", "failed", "expired", "cancelled") else None
    # the batch's last lines may go to the slow phones: with the guards' load high a fast
    # phone is moved back to them while lines still wait (a batch's backlog counts as its
    # lines are started: docs/placement.md, "Limits"), and in a fresh-clone CI run the last
    # 8 lines took a slow phone 5 s each -- still ending, after the 60 s this allowed
    assert wait_until(batch_done, T(120)), "the batch did not end"
    st = batch_done()
    assert st["status"] == "completed" and st["request_counts"]["completed"] == 24, json.dumps(st)
    assert st["request_counts"]["failed"] == 0

    # day again: many more guards (longer messages and answers), no reviews: the phones
    # come back (one may stay while reviews were asked for lately)
    long_msg = fleet.make_prompt(300, tag="guard")
    more = [threading.Thread(target=guards, args=(0.0, 64, long_msg), daemon=True) for _ in range(6)]
    for t in more:
        t.start()
    assert wait_until(lambda: len(ready_on(g, GUARD)) >= 3, T(40)), json.dumps(admin(g, "/admin/v1/placements"))
    stop.set()
    for t in threads + more:
        t.join(T(30))
        assert not t.is_alive()
    bad = [r for r in results if r[1] != 200]
    assert not bad, bad[:5]
    assert len(results) > 50
    switches = events(g, "placement_switch")
    assert len(switches) <= 8, [(e["replica"], e["to"]) for e in switches]
    assert any(e["to"] == GUARD for e in switches)
    done = events(g, "placement_switched")
    assert len(done) >= 2 and not events(g, "placement_switch_failed")
    # what operators see
    pl = admin(g, "/admin/v1/placements")
    models = {m["model"]: m for m in pl["models"]}
    assert models[REVIEW]["switches"]["done"] >= 1 and models[GUARD]["switches"]["done"] >= 1
    metrics = requests.get(g.admin_url + "/metrics", headers=ADMIN, timeout=T(5)).text
    assert f'fleetgate_placement_switches_total{{model="{REVIEW}",outcome="done"}}' in metrics
    assert f'fleetgate_model_phones{{model="{GUARD}",state="serving"}}' in metrics


def test_a_wrong_digest_leaves_the_phone_on_its_model_with_the_reason(procs, gateway, tmp_path):
    g, _ = start(procs, gateway, tmp_path, PHONES[:2], extra=("--sim-corrupt-download", REVIEW))
    # an operator pins a phone to the 9B: it drains, downloads, the digest differs
    r = requests.post(g.admin_url + "/admin/v1/placements/pin", headers=ADMIN,
                      json={"replica": "fast-2", "model": REVIEW}, timeout=T(5))
    assert r.status_code == 200, r.text
    assert wait_until(lambda: events(g, "placement_switch_failed"), T(20)), replicas(g)
    rep = replicas(g)["fast-2"]
    assert "SHA-256" in rep["switch_failed"] and REVIEW in rep["switch_failed"], rep
    assert rep["models"] == [GUARD] and rep["switch"] is None
    assert wait_until(lambda: replicas(g)["fast-2"]["state"] in ("ready", "busy"), T(10)), replicas(g)
    # it serves its model again, and is not sent to the 9B again for a while
    ok = [chat(g, GUARD, f"after {i}") for i in range(6)]
    assert all(x.status_code == 200 for x in ok)
    time.sleep(T(1.5))
    assert len(events(g, "placement_switch")) == 1
    pl = {p["id"]: p for p in admin(g, "/admin/v1/placements")["phones"]}
    assert pl["fast-2"]["last_failure"] and pl["fast-2"]["desired"] == GUARD
    # bad overrides are refused in OpenAI's error shape
    for body, status, code in (({"replica": "fast-1", "model": "nope"}, 400, "invalid_request"),
                               ({"replica": "nobody", "model": GUARD}, 404, "replica_not_found"),
                               ({"model": GUARD}, 400, "invalid_request")):
        x = requests.post(g.admin_url + "/admin/v1/placements/pin", headers=ADMIN, json=body, timeout=T(5))
        assert x.status_code == status and x.json()["error"]["code"] == code, x.text
    x = requests.post(g.admin_url + "/admin/v1/placements/exclude", headers=ADMIN,
                      json={"model": REVIEW, "exclude": True}, timeout=T(5))
    assert x.status_code == 200 and {m["model"]: m for m in x.json()["models"]}[REVIEW]["excluded"]


class Files:
    """A local download server: GET /NAME answers files[NAME] (Range resumes)."""

    def __init__(self):
        self.files = {}
        files = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                body = files.files.get(self.path.lstrip("/"))
                if body is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                start = 0
                m = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
                if m:
                    start = int(m.group(1))
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                self.wfile.write(body[start:])

        self.server = http.server.ThreadingHTTPServer((HOST, 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{HOST}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_an_agent_fetches_checks_and_restarts_llama_server_with_the_model(procs, gateway, tmp_path):
    """The real llama-server behind the agent: pinned to another model, the agent drains,
    downloads it from a local server, checks its digest, restarts the engine with it and
    serves it; pinned to a model whose download has the wrong digest, it stays on its model
    and the reason is on the admin API (the status page's data); pinned to one whose file
    has its digest but that the engine cannot load (a truncated GGUF), it goes back to the
    model it had and serves it, the reason said the same way."""
    try:
        eng = llama.prepare(tmp_path / "engine")
    except llama.EngineMissing as e:
        if llama.in_ci():
            raise
        pytest.skip(str(e))
    tiny = eng.model.read_bytes()
    other = tiny + b"\0" * 4096  # the same model under another name and digest
    models = tmp_path / "models"
    models.mkdir()
    (models / "guard-tiny.gguf").write_bytes(tiny)
    srv = Files()
    srv.files["review-tiny.gguf"] = other
    srv.files["bad-tiny.gguf"] = other
    broken = tiny[:len(tiny) // 2]  # its digest right, its tensors cut off
    srv.files["broken-tiny.gguf"] = broken
    try:
        data = tmp_path / "data"
        data.mkdir()

        def cfg(p):
            c = gw_cfg(p, data, min_stay_s=0)
            c["models"] = [
                {"name": "guard-tiny", "url": f"{srv.url}/guard-tiny.gguf", "sha256": hashlib.sha256(tiny).hexdigest(),
                 "size_bytes": len(tiny)},
                {"name": "review-tiny", "url": f"{srv.url}/review-tiny.gguf",
                 "sha256": hashlib.sha256(other).hexdigest(), "size_bytes": len(other)},
                {"name": "bad-tiny", "url": f"{srv.url}/bad-tiny.gguf", "sha256": "0" * 64, "size_bytes": len(other)},
                {"name": "broken-tiny", "url": f"{srv.url}/broken-tiny.gguf",
                 "sha256": hashlib.sha256(broken).hexdigest(), "size_bytes": len(broken)},
            ]
            return c
        g = gateway(cfg, n_ports=2, env={"FG_PLACE_SECRET": SECRET})
        g.admin_url = f"http://{HOST}:{g.ports[1]}"

        def argv(ports):
            conf = {"command": str(eng.bin), "upstream": f"http://{HOST}:{ports[1]}", "restart_max_s": 2,
                    "ready_timeout_s": 60, "stop_timeout_s": 5,
                    "args": llama.args(eng, ports[1], slots=1, alias="guard-tiny")}
            conf["args"][1] = str(models / "guard-tiny.gguf")
            path = tmp_path / "agent.json"
            path.write_text(json.dumps(conf))
            return [fleet.agent_bin(), "--engine", "llama", "--listen", f"{HOST}:{ports[0]}", "--config", str(path),
                    "--id", "real-1", "--model", "guard-tiny", "--models-dir", str(models),
                    "--gateway", g.url, "--public-url", f"http://{HOST}:{ports[0]}"]
        procs.spawn("agent", argv, n_ports=2, env={"FLEETGATE_FLEET_SECRET": SECRET}, ready_timeout=60)
        assert wait_until(lambda: ready_on(g, "guard-tiny") == ["real-1"], T(60)), replicas(g)
        assert chat(g, "guard-tiny", "hello").status_code == 200

        r = requests.post(g.admin_url + "/admin/v1/placements/pin", headers=ADMIN,
                          json={"replica": "real-1", "model": "review-tiny"}, timeout=T(5))
        assert r.status_code == 200, r.text
        assert wait_until(lambda: ready_on(g, "review-tiny") == ["real-1"], T(90)), replicas(g)
        assert (models / "review-tiny.gguf").read_bytes() == other  # fetched, checked, kept
        a = chat(g, "review-tiny", "hello again")
        assert a.status_code == 200 and a.headers["x-fleetgate-replica"] == "real-1", a.text
        done = events(g, "placement_switched")
        assert [e["to"] for e in done] == ["review-tiny"], done

        r = requests.post(g.admin_url + "/admin/v1/placements/pin", headers=ADMIN,
                          json={"replica": "real-1", "model": "bad-tiny"}, timeout=T(5))
        assert r.status_code == 200, r.text
        assert wait_until(lambda: events(g, "placement_switch_failed"), T(60)), replicas(g)
        rep = replicas(g)["real-1"]
        assert "bad-tiny" in rep["switch_failed"] and "sha256" in rep["switch_failed"].lower(), rep
        assert not (models / "bad-tiny.gguf").exists()
        assert wait_until(lambda: ready_on(g, "review-tiny") == ["real-1"], T(30)), replicas(g)
        assert chat(g, "review-tiny", "still here").status_code == 200

        # a file the engine cannot load: fetched and checked, the engine exits loading it
        # (twice), and the agent restarts it with the model it had
        r = requests.post(g.admin_url + "/admin/v1/placements/pin", headers=ADMIN,
                          json={"replica": "real-1", "model": "broken-tiny"}, timeout=T(5))
        assert r.status_code == 200, r.text
        assert wait_until(lambda: len(events(g, "placement_switch_failed")) >= 2, T(90)), replicas(g)
        rep = replicas(g)["real-1"]
        assert "broken-tiny" in rep["switch_failed"] and "exited" in rep["switch_failed"], rep
        assert (models / "broken-tiny.gguf").read_bytes() == broken  # its digest was right
        assert wait_until(lambda: ready_on(g, "review-tiny") == ["real-1"], T(60)), replicas(g)
        a = chat(g, "review-tiny", "back again")
        assert a.status_code == 200 and a.headers["x-fleetgate-replica"] == "real-1", a.text
        assert [e["to"] for e in events(g, "placement_switched")] == ["review-tiny"]
    finally:
        srv.server.shutdown()


def test_heartbeats_with_a_malformed_switch_are_refused(procs, gateway, tmp_path):
    """What a heartbeat says of a switch is checked whole before anything is applied."""
    import gwutil as g  # noqa: PLC0415
    data = tmp_path / "data"
    data.mkdir()
    gw = gateway(lambda p: gw_cfg(p, data), n_ports=2, env={"FG_PLACE_SECRET": SECRET})
    base = {"id": "phone-s", "url": "http://127.0.0.1:9", "models": [GUARD], "slots": 1, "state": "ready",
            "can_switch": True}
    key = g.PhoneKey()

    def hb(**over):
        raw, h = g.heartbeat_headers(dict(base, **over), secret=SECRET, key=key)
        return requests.post(gw.url + "/fleet/v1/heartbeat", data=raw, timeout=T(5), headers=h)
    for bad in ({"to": REVIEW, "phase": "dancing"}, {"to": REVIEW}, {"to": "", "phase": "loading"},
                {"to": REVIEW, "phase": "loading", "why": "no"}, {"to": REVIEW, "phase": "failed"},
                {"to": REVIEW, "phase": "failed", "why": "x" * 301}, {"to": REVIEW, "phase": "loading", "extra": 1}):
        r = hb(switch=bad)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_heartbeat", (bad, r.text)
        time.sleep(0.3)
    assert hb(can_switch="yes").status_code == 400
    time.sleep(0.3)
    r = hb(switch={"to": REVIEW, "phase": "failed", "why": "the download failed"})
    assert r.status_code == 200 and "place" not in r.json(), r.text  # nothing was asked of it


def test_an_operators_pin_survives_a_restart_with_data_dir(procs, gateway, tmp_path):
    """A pin made through the admin API is kept in data_dir (placement-pins.json) and comes
    back when the phone's first heartbeat reaches the restarted gateway: the phone stays on
    the pinned model however busy the others are; an unpin is kept likewise."""
    g, _ = start(procs, gateway, tmp_path, PHONES[:2])
    r = requests.post(g.admin_url + "/admin/v1/placements/pin", headers=ADMIN,
                      json={"replica": "fast-2", "model": REVIEW}, timeout=T(5))
    assert r.status_code == 200, r.text
    assert wait_until(lambda: ready_on(g, REVIEW) == ["fast-2"], T(30)), replicas(g)
    kept = tmp_path / "data" / "placement-pins.json"
    assert json.loads(kept.read_text()) == {"pins": {"fast-2": REVIEW}}
    assert kept.stat().st_mode & 0o777 == 0o600
    ports = g.ports
    g.stop()

    def again():
        gateway(gw_cfg(ports, tmp_path / "data"), n_ports=0, env={"FG_PLACE_SECRET": SECRET},
                ready=lambda _: fleet.port_accepts(ports[0]) and fleet.port_accepts(ports[1]))
        return types.SimpleNamespace(url=g.url, admin_url=g.admin_url)
    g2 = again()

    def pinned():
        pl = {p["id"]: p for p in admin(g2, "/admin/v1/placements")["phones"]}
        return pl if pl.get("fast-2", {}).get("pin") == REVIEW else None
    assert wait_until(pinned, T(20)), admin(g2, "/admin/v1/placements")
    # busy guards would take an unpinned phone serving a model nobody asks for back
    with concurrent.futures.ThreadPoolExecutor(6) as ex:
        got = list(ex.map(lambda i: chat(g2, GUARD, f"guard {i} " + fleet.make_prompt(300, tag="g"), 64),
                          range(60)))
    assert all(x.status_code == 200 for x in got), [x.text[:200] for x in got if x.status_code != 200]
    assert events(g2, "placement_switch") == [] and ready_on(g2, REVIEW) == ["fast-2"], replicas(g2)
    assert chat(g2, REVIEW, "a review").headers["x-fleetgate-replica"] == "fast-2"
    # an unpin is kept too
    r = requests.post(g2.admin_url + "/admin/v1/placements/pin", headers=ADMIN,
                      json={"replica": "fast-2", "model": None}, timeout=T(5))
    assert r.status_code == 200, r.text
    assert json.loads(kept.read_text()) == {"pins": {}}


def test_labels_of_phones_that_join_by_heartbeat_decide_which_models_they_may_run(procs, gateway, tmp_path):
    """A catalogue model with `labels` goes only to phones with them: a phone that joins by
    heartbeat has the labels its agent says (--label, the heartbeat's `labels`)."""
    import gwutil as gu  # noqa: PLC0415
    data = tmp_path / "data"
    data.mkdir()

    def cfg(p):
        c = gw_cfg(p, data)
        c["models"][1]["labels"] = {"class": "flagship"}
        return c
    g = gateway(cfg, n_ports=2, env={"FG_PLACE_SECRET": SECRET})
    g.admin_url = f"http://{HOST}:{g.ports[1]}"
    ports_file = tmp_path / "ports.json"
    procs.spawn("phones", lambda ports: [
        fleet.agent_bin(), "--engine", "sim", "--listen", f"{HOST}:0", "--model", GUARD, "--slots", "1",
        "--id", "budget", "--phones", "1", "--ports-file", str(ports_file), "--label", "class=budget",
        "--label", "site=lab-2", "--gateway", g.url, "--public-url", f"http://{HOST}:{{port}}"],
        n_ports=0, env={"FLEETGATE_FLEET_SECRET": SECRET}, ready=lambda d: ports_file.exists())
    assert wait_until(lambda: ready_on(g, GUARD) == ["budget-1"], T(20)), replicas(g)
    assert replicas(g)["budget-1"]["labels"] == {"class": "budget", "site": "lab-2"}

    def pin(rid):
        return requests.post(g.admin_url + "/admin/v1/placements/pin", headers=ADMIN,
                             json={"replica": rid, "model": REVIEW}, timeout=T(5))
    r = pin("budget-1")
    assert r.status_code == 400 and "labels lack" in r.json()["error"]["message"], r.text
    # a phone whose heartbeats say class flagship may
    key = gu.PhoneKey()
    base = {"id": "flag-9", "url": "http://127.0.0.1:9", "models": [GUARD], "slots": 1, "state": "ready",
            "can_switch": True}

    def hb(**over):
        raw, h = gu.heartbeat_headers(dict(base, **over), secret=SECRET, key=key)
        return requests.post(g.url + "/fleet/v1/heartbeat", data=raw, timeout=T(5), headers=h)
    assert hb(labels={"class": "flagship"}).status_code == 200
    assert replicas(g)["flag-9"]["labels"] == {"class": "flagship"}
    r = pin("flag-9")
    assert r.status_code == 200, r.text
    # bad labels are refused whole; a heartbeat without them leaves the phone none
    for bad in ({"class": 5}, {"a b": "x"}, {"class": ""}, {"class": "x" * 129},
                {f"k{i}": "v" for i in range(17)}, ["class"]):
        time.sleep(0.3)
        x = hb(labels=bad)
        assert x.status_code == 400 and x.json()["error"]["code"] == "invalid_heartbeat", (bad, x.text)
    assert replicas(g)["flag-9"]["labels"] == {"class": "flagship"}
    time.sleep(0.3)
    assert hb().status_code == 200
    assert replicas(g)["flag-9"]["labels"] == {}
    # the agent refuses a malformed --label at start
    import subprocess  # noqa: PLC0415
    p = subprocess.run([fleet.agent_bin(), "--engine", "sim", "--listen", f"{HOST}:0", "--model", GUARD,
                        "--label", "no-equals-sign"], capture_output=True, text=True, timeout=T(10))
    assert p.returncode != 0 and "--label: expected NAME=VALUE" in p.stderr, p.stderr
