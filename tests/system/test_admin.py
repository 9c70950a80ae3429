"""System tests of the admin listener (issue 7): the admin API with and without the token,
drain/enable kept across reloads, reload answers (what changed, or why refused), the
queue and events endpoints (JSON and server-sent events), /metrics in Prometheus text
(names, types, values that move as requests run; promtool and a real Prometheus where
installed), the status page's own stream and page, and a clean SIGTERM with streams open.

The gateway listens on two free ports: the client API (ports[0]) and admin (ports[1])."""

import concurrent.futures
import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest
import requests

import fleet
import gwutil as g
from fleet import HOST, T, wait_until
from gwutil import MODEL, chat, check_chat_ok, phone, replica

TOKEN = "test-admin-token-0123456789"
TOKEN_ENV = "FLEETGATE_TEST_ADMIN_TOKEN"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


# ---------------------------------------------------------------------------- helpers

class Admin:
    """Requests to a gateway's admin listener."""

    def __init__(self, d):
        self.d = d
        self.url = f"http://{HOST}:{d.ports[1]}"

    def get(self, path, auth=True, **kw):
        h = dict(AUTH if auth else {})
        h.update(kw.pop("headers", {}))
        return requests.get(self.url + path, headers=h, timeout=kw.pop("timeout", T(10)), **kw)

    def post(self, path, auth=True, **kw):
        h = dict(AUTH if auth else {})
        h.update(kw.pop("headers", {}))
        return requests.post(self.url + path, headers=h, timeout=kw.pop("timeout", T(15)), **kw)

    def replicas(self):
        r = self.get("/admin/v1/replicas")
        assert r.status_code == 200, r.text
        return {x["id"]: x for x in r.json()["replicas"]}

    def state(self, rid):
        return self.replicas()[rid]["state"]

    def metrics_text(self):
        r = self.get("/metrics")
        assert r.status_code == 200, r.text
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4"), r.headers
        return r.text

    def metrics(self):
        return fleet.parse_prometheus(self.metrics_text())


def admin_config(ports, replicas, public_read=False, admin_extra=None, **kw):
    cfg = g.gw_config(ports[0], replicas, **kw)
    cfg["admin"] = {"listen": f"{HOST}:{ports[1]}", "token_env": TOKEN_ENV}
    if public_read:
        cfg["admin"]["public_read"] = True
    cfg["admin"].update(admin_extra or {})
    return cfg


def start(gateway, replicas, ready=None, public_read=False, **kw):
    """fleetgate with an admin listener in front of replicas; ready once /readyz counts
    `ready` replicas (default: all not drained; 0: don't wait). Returns (daemon, Admin)."""
    if ready is None:
        ready = sum(1 for r in replicas if not r.get("drain"))
    check = (lambda d: (g.replicas_ready(d) or 0) >= ready) if ready else None
    d = gateway(lambda ports: admin_config(ports, replicas, public_read=public_read, **kw),
                n_ports=2, env={TOKEN_ENV: TOKEN}, ready=check)
    return d, Admin(d)


def rewrite_config(d, change):
    """Load d's config file, let change(cfg) edit it, write it back."""
    cfg = json.loads(d.config_path.read_text())
    change(cfg)
    d.config_path.write_text(json.dumps(cfg, indent=2))


class SSEReader:
    """Reads a server-sent event stream in a thread: (event, id, data) tuples in order."""

    def __init__(self, url, headers, timeout=None):
        self.resp = requests.get(url, headers=dict(headers, Accept="text/event-stream"),
                                 stream=True, timeout=timeout or T(10))
        self.events = []
        self.error = None
        self.ended = False
        self._lock = threading.Lock()
        self._t = threading.Thread(target=self._run, daemon=True)
        if self.resp.status_code == 200:
            self._t.start()

    def _run(self):
        name, eid, data = "message", None, []
        buf = ""
        try:
            for piece in self.resp.iter_content(chunk_size=None):
                buf += piece.decode("utf-8", errors="replace")
                while "\n" in buf:
                    line, buf = buf.split("\n", 1)
                    line = line.rstrip("\r")
                    if line == "":
                        if data:
                            with self._lock:
                                self.events.append((name, eid, "\n".join(data)))
                        name, eid, data = "message", None, []
                    elif line.startswith(":"):
                        continue
                    else:
                        k, _, v = line.partition(":")
                        v = v[1:] if v.startswith(" ") else v
                        if k == "event":
                            name = v
                        elif k == "id":
                            eid = int(v)
                        elif k == "data":
                            data.append(v)
        except Exception as e:  # noqa: BLE001 - ended by close() or the server
            self.error = e
        self.ended = True

    def named(self, name):
        with self._lock:
            return [(i, json.loads(dt)) for n, i, dt in self.events if n == name]

    def wait_for(self, pred, timeout):
        return wait_until(lambda: pred(self), timeout, interval=0.05)

    def close(self):
        try:
            self.resp.close()
        except Exception:  # noqa: BLE001
            pass


def two_phones(sim, **kw):
    return [phone(sim, "p1", slots=2, **kw), phone(sim, "p2", slots=1, **kw)]


# ---------------------------------------------------------------------------- the token

READS = ["/metrics", "/admin/v1/status", "/admin/v1/replicas", "/admin/v1/replicas/p1",
         "/admin/v1/queue", "/admin/v1/events"]
WRITES = ["/admin/v1/replicas/p1/drain", "/admin/v1/replicas/p1/enable", "/admin/v1/reload"]


def test_every_endpoint_needs_the_admin_token_but_health_and_the_page(sim, gateway):
    phones = two_phones(sim)
    d, a = start(gateway, [replica(p, cost_per_day=0.5) for p in phones])
    for path in READS:
        r = a.get(path, auth=False)
        assert r.status_code == 401, (path, r.status_code)
        e = g.check_error_body(r.text, 401, "missing_admin_token", what=f"GET {path}")
        assert e["type"] == "authentication_error", (path, e)
        assert r.headers.get("WWW-Authenticate", "").startswith("Bearer"), (path, r.headers)
        r = a.get(path, auth=False, headers={"Authorization": "Bearer not-the-token"})
        assert r.status_code == 401, (path, r.status_code)
        assert g.check_error_body(r.text, 401, "invalid_admin_token")
        r = a.get(path)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
    for path in WRITES:
        r = a.post(path, auth=False)
        assert r.status_code == 401, (path, r.status_code)
        g.check_error_body(r.text, 401, "missing_admin_token")
        r = a.post(path, auth=False, headers={"Authorization": f"Bearer {TOKEN}x"})
        assert r.status_code == 401, (path, r.status_code)
        r = a.post(path)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
    # the health endpoint and the page need no token; neither holds fleet data
    r = a.get("/healthz", auth=False)
    assert r.status_code == 200 and r.json() == {"status": "ok", "read_needs_token": True}, r.text
    r = a.get("/", auth=False)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/html"), r.headers
    assert "p1" not in r.text and "sim-model" not in r.text
    # the client listener does not serve the admin API
    r = d.get("/admin/v1/replicas", headers=AUTH)
    assert r.status_code == 404, r.status_code


def test_public_read_opens_reads_but_not_actions(sim, gateway):
    phones = two_phones(sim)
    d, a = start(gateway, [replica(p) for p in phones], public_read=True)
    for path in READS:
        r = a.get(path, auth=False)
        assert r.status_code == 200, (path, r.status_code, r.text[:200])
    for path in WRITES:
        r = a.post(path, auth=False)
        assert r.status_code == 401, (path, r.status_code)
    assert a.get("/healthz", auth=False).json()["read_needs_token"] is False


def test_admin_config_is_checked(tmp_path):
    def check(cfg, env=None):
        p = tmp_path / "c.json"
        p.write_text(json.dumps(cfg, indent=2))
        e = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
        e.update(env or {})
        return subprocess.run([fleet.gateway_bin(), "--check-config", str(p)], env=e,
                              capture_output=True, text=True, timeout=T(10))
    base = {"listen": "127.0.0.1:1", "replicas": []}
    r = check(dict(base, admin={"listen": "127.0.0.1:9"}))
    assert r.returncode == 1 and re.search(r"c\.json:\d+:\d+: admin: token_env", r.stderr), r.stderr
    r = check(dict(base, admin={"token_env": TOKEN_ENV}))
    assert r.returncode == 1 and "FLEETGATE_TEST_ADMIN_TOKEN is not set" in r.stderr, r.stderr
    r = check(dict(base, admin={"token_env": TOKEN_ENV}), env={TOKEN_ENV: "short"})
    assert r.returncode == 1 and "at least 16 characters" in r.stderr, r.stderr
    r = check(dict(base, admin={"token_env": TOKEN_ENV, "colour": 1}), env={TOKEN_ENV: TOKEN})
    assert r.returncode == 1 and re.search(r":\d+:\d+: admin\.colour: unknown key", r.stderr), r.stderr
    r = check(dict(base, admin={"listen": "nowhere", "token_env": TOKEN_ENV}), env={TOKEN_ENV: TOKEN})
    assert r.returncode == 1 and "admin.listen: expected HOST:PORT" in r.stderr, r.stderr
    r = check(dict(base, admin={"token_env": TOKEN_ENV}), env={TOKEN_ENV: TOKEN})
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------------------- replicas, drain

def test_replicas_list_detail_and_errors(sim, gateway):
    phones = two_phones(sim)
    reps = [replica(phones[0], cost_per_day=0.6, labels={"device": "pixel"}, token="replica-secret-42"),
            replica(phones[1], cost_per_day=0.4)]
    d, a = start(gateway, reps)
    r = a.get("/admin/v1/replicas")
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/json", r.headers
    body = r.json()
    ids = [x["id"] for x in body["replicas"]]
    assert sorted(ids) == ["p1", "p2"], ids
    s = body["summary"]
    assert s["replicas"] == {"ready": 2, "busy": 0, "loading": 0, "down": 0, "draining": 0, "total": 2}, s
    assert s["slots"] == {"total": 3, "busy": 0} and abs(s["cost_per_day"] - 1.0) < 1e-9, s
    p1 = a.get("/admin/v1/replicas/p1").json()
    for k in ("id", "state", "health", "reason", "state_since_ms", "state_for_s", "draining", "drain",
              "models", "slots", "slots_busy", "prefill_tps", "decode_tps", "latency_s", "failures",
              "consecutive_failures", "last_seen_s", "battery_pct", "temperature_c", "cost_per_day",
              "labels", "url", "source"):
        assert k in p1, (k, p1)
    assert p1["state"] == "ready" and p1["models"] == [MODEL] and p1["slots"] == 2, p1
    assert p1["labels"] == {"device": "pixel"} and p1["source"] == "config", p1
    assert "replica-secret-42" not in a.get("/admin/v1/replicas").text, p1
    assert p1["prefill_tps"] == phones[0].real_prefill, p1
    # a request shows up in the replica's numbers
    check_chat_ok(chat(d, max_tokens=4))
    rs = a.replicas()
    served = [x for x in rs.values() if x["successes"] == 1]
    assert len(served) == 1 and served[0]["latency_s"] > 0 and served[0]["tokens_out"] == 4, rs
    # errors
    r = a.get("/admin/v1/replicas/nope")
    assert r.status_code == 404 and g.check_error_body(r.text, 404, "replica_not_found"), r.text
    r = a.post("/admin/v1/replicas/nope/drain")
    assert r.status_code == 404, r.status_code
    r = a.post("/admin/v1/replicas/p1/explode")
    assert r.status_code == 404 and g.check_error_body(r.text, 404, "unknown_url"), r.text
    r = a.get("/admin/v1/replicas/p1/drain")
    assert r.status_code == 405 and r.headers.get("Allow") == "POST", (r.status_code, r.headers)
    r = a.post("/admin/v1/replicas")
    assert r.status_code == 405 and r.headers.get("Allow") == "GET", r.status_code
    r = a.get("/admin/v1/reload")
    assert r.status_code == 405, r.status_code
    r = a.get("/admin/v2/whatever")
    assert r.status_code == 404, r.status_code
    r = a.get("/admin/v1/replicas/p%31")  # percent-encoded id
    assert r.status_code == 200 and r.json()["id"] == "p1", r.text


def test_drain_and_enable_are_kept_across_reloads(sim, gateway):
    phones = two_phones(sim)
    d, a = start(gateway, [replica(p) for p in phones])
    r = a.post("/admin/v1/replicas/p1/drain")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["state"] == "draining" and body["drain"]["admin"] is True, body
    # no new work goes to p1
    for i in range(6):
        check_chat_ok(chat(d, content=f"d{i}", max_tokens=2), want_replica="p2")
    # a reload (admin API and SIGHUP) keeps the admin's drain
    r = a.post("/admin/v1/reload")
    assert r.status_code == 200, r.text
    d.send_signal(signal.SIGHUP)
    assert wait_until(lambda: len(g.log_msgs(d, "configuration reloaded")) >= 2, T(5))
    assert a.state("p1") == "draining"
    # so does a reload that changes p1's settings
    rewrite_config(d, lambda c: c["replicas"][0].update(cost_per_day=2.5))
    r = a.post("/admin/v1/reload")
    assert r.status_code == 200 and r.json()["changes"]["changed"] == ["p1"], r.text
    p1 = a.replicas()["p1"]
    assert p1["state"] == "draining" and p1["cost_per_day"] == 2.5, p1
    r = a.post("/admin/v1/replicas/p1/enable")
    assert r.status_code == 200 and r.json()["state"] == "ready", r.text
    served = set()
    for i in range(8):
        body = check_chat_ok(chat(d, content=f"e{i}", max_tokens=2))
        served.add(body["system_fingerprint"])
    assert "p1" in served, served
    # a drain in the config file is not lifted by enable
    rewrite_config(d, lambda c: c["replicas"][1].update(drain=True))
    assert a.post("/admin/v1/reload").status_code == 200
    r = a.post("/admin/v1/replicas/p2/enable")
    assert r.status_code == 200 and r.json()["state"] == "draining", r.text
    assert r.json()["drain"] == {"admin": False, "config": True, "agent": False, "removed": False,
                                 "placement": False}
    # each action is an event and a log line
    evs = [e["type"] for e in a.get("/admin/v1/events").json()["events"]]
    assert "replica_drained" in evs and "replica_enabled" in evs, evs
    assert g.log_msgs(d, "replica drained through the admin API", replica="p1")


# ---------------------------------------------------------------------------- reload

def test_reload_answers_what_changed_or_why_refused(sim, gateway):
    phones = [phone(sim, "p1"), phone(sim, "p2"), phone(sim, "p3")]
    d, a = start(gateway, [replica(phones[0]), replica(phones[1])])
    rewrite_config(d, lambda c: c["replicas"].append(replica(phones[2])))
    r = a.post("/admin/v1/reload")
    assert r.status_code == 200, r.text
    assert r.json() == {"reloaded": True, "changes": {"added": ["p3"], "removed": [], "changed": []}}, r.text
    assert wait_until(lambda: a.state("p3") == "ready", T(5)), a.replicas()["p3"]
    rewrite_config(d, lambda c: c["replicas"].pop(0))
    r = a.post("/admin/v1/reload")
    assert r.json()["changes"]["removed"] == ["p1"], r.text
    # a bad edit is refused, with the file, line and column, and nothing changes
    text = d.config_path.read_text()
    d.config_path.write_text(text.replace('"slots": 1', '"slots": "many"', 1))
    r = a.post("/admin/v1/reload")
    assert r.status_code == 422, (r.status_code, r.text)
    body = r.json()
    e = g.check_error_body(r.text, 422, "reload_refused")
    assert "unchanged" in e["message"] and body["reloaded"] is False, body
    assert body["errors"] and re.match(rf"{re.escape(str(d.config_path))}:\d+:\d+: replicas\[\d\]\.slots",
                                       body["errors"][0]), body["errors"]
    # p1 leaves once its requests are done (read once: it may go between two reads)
    reps = set(a.replicas())
    assert reps in ({"p2", "p3"}, {"p1", "p2", "p3"}), reps
    # the feed tells both stories
    evs = a.get("/admin/v1/events").json()["events"]
    types = [e["type"] for e in evs]
    assert types.count("config_reloaded") >= 2 and "reload_refused" in types, types
    refused = [e for e in evs if e["type"] == "reload_refused"][-1]
    assert "slots" in refused["message"] and refused["trigger"] == "admin API", refused
    added = [e for e in evs if e["type"] == "config_reloaded"][0]
    assert "added p3" in added["message"], added
    m = a.metrics()
    assert m['fleetgate_config_reloads_total{result="applied"}'] == 2, m
    assert m['fleetgate_config_reloads_total{result="refused"}'] == 1, m
    # the admin listener itself keeps its socket over a reload
    d.config_path.write_text(text)
    assert a.post("/admin/v1/reload").status_code == 200
    assert a.get("/healthz", auth=False).status_code == 200


def test_admin_listener_moves_with_the_config(sim, gateway):
    p = phone(sim, "p1")
    d, a = start(gateway, [replica(p)])
    new_port = fleet.free_port()
    rewrite_config(d, lambda c: c["admin"].update(listen=f"{HOST}:{new_port}"))
    r = a.post("/admin/v1/reload")  # answered on the old listener
    assert r.status_code == 200, r.text
    assert wait_until(lambda: fleet.port_accepts(new_port), T(3)), "new admin port not open"
    r = requests.get(f"http://{HOST}:{new_port}/admin/v1/replicas", headers=AUTH, timeout=T(5))
    assert r.status_code == 200, r.text
    assert wait_until(lambda: not fleet.port_accepts(d.ports[1]), T(5)), "old admin port still open"


# ---------------------------------------------------------------------------- queue, events

def test_queue_depth_per_model_and_oldest_wait(sim, gateway):
    p = phone(sim, "p1", slots=1, decode_tps=10)  # 8 tokens: about 0.1 s per request
    d, a = start(gateway, [replica(p)])
    n = 6
    with concurrent.futures.ThreadPoolExecutor(max_workers=n) as ex:
        futs = [ex.submit(chat, d, content=f"q{i}", max_tokens=40, timeout=T(60)) for i in range(n)]
        # the reasons are those of the last planning pass: read once one has seen the queue
        seen = wait_until(lambda: (lambda q: q if q["depth"] >= 3 and sum(q["waiting"].values()) >= 1
                                   else None)(a.get("/admin/v1/queue").json()),
                          T(10), interval=0.02)
        assert seen, "the queue never held 3 requests"
        assert seen["models"][0]["model"] == MODEL and seen["models"][0]["depth"] == seen["depth"], seen
        assert seen["interactive"] == seen["depth"] and seen["batch"] == 0, seen
        # one phone, its slot busy: they wait for it, with nothing free elsewhere (as of the
        # last planning pass: one that arrived since is not counted yet)
        w = seen["waiting"]
        assert 1 <= w.pop("busy") <= seen["depth"], seen
        assert w == {"faster_phone": 0, "kept_for_short_work": 0, "held_back": 0, "no_phone": 0}, seen
        time.sleep(0.3)
        q = a.get("/admin/v1/queue").json()
        m = a.metrics()
        assert q["depth"] >= 1 and q["oldest_wait_s"] >= 0.3, q
        assert m[f'fleetgate_queue_depth{{model="{MODEL}"}}'] >= 1, m
        assert m[f'fleetgate_queue_oldest_wait_seconds{{model="{MODEL}"}}'] >= 0.3, m
        assert m['fleetgate_replica_slots_busy{replica="p1"}'] == 1, m
        st = a.get("/admin/v1/status").json()
        assert st["summary"]["replicas"]["busy"] == 1 and st["queue"]["depth"] >= 1, st["summary"]
        for f in futs:
            check_chat_ok(f.result())
    q = a.get("/admin/v1/queue").json()
    # one phone: none stayed free while requests waited
    assert q == {"depth": 0, "models": [], "oldest_wait_s": 0, "interactive": 0, "batch": 0,
                 "waiting": {"busy": 0, "faster_phone": 0, "kept_for_short_work": 0,
                             "held_back": 0, "no_phone": 0}, "idle_while_waiting_s": 0}, q
    m = a.metrics()
    assert m[f'fleetgate_queue_wait_seconds_count{{model="{MODEL}"}}'] == n, m
    assert m[f'fleetgate_queue_wait_seconds_sum{{model="{MODEL}"}}'] > 0.5, m


def test_queue_says_why_requests_wait_while_a_phone_is_free(sim, gateway):
    """Requests that wait for a busy fast phone while a slow one sits free are counted as
    waiting for a faster phone, in the admin API (which the status page reads) and the
    metric, and the slow phone's free slot counts as phone time idle while requests waited;
    a model no phone serves waits for a phone."""
    fast = phone(sim, "fast", slots=1, decode_tps=20)  # 40 tokens: 2 s
    slow = phone(sim, "slow", slots=1, decode_tps=1)   # 40 tokens: 40 s
    other = phone(sim, "other", slots=1)
    d, a = start(gateway, [replica(fast), replica(slow),
                           replica(other, models=["other-model"], drain=True)],
                 scheduler={"expected_output_tokens": 40})
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as ex:
        futs = [ex.submit(chat, d, content=f"w{i}", max_tokens=40, timeout=T(60)) for i in range(3)]
        seen = wait_until(lambda: (lambda q: q if q["waiting"]["faster_phone"] >= 2 else None)(
            a.get("/admin/v1/queue").json()), T(10), interval=0.05)
        assert seen, a.get("/admin/v1/queue").json()
        assert seen["depth"] == 2 and seen["waiting"]["busy"] == 0, seen
        assert a.state("slow") == "ready", a.replicas()["slow"]
        m = a.metrics()
        assert m['fleetgate_queue_waiting{reason="faster_phone"}'] == 2, m
        assert m['fleetgate_queue_waiting{reason="no_phone"}'] == 0, m
        st = a.get("/admin/v1/status").json()
        assert st["queue"]["waiting"]["faster_phone"] == 2, st["queue"]
        idle0 = m["fleetgate_idle_while_waiting_seconds_total"]
        time.sleep(0.5)
        # the slow phone's one slot was free all along, while two requests waited
        idle1 = a.get("/admin/v1/queue").json()["idle_while_waiting_s"]
        assert idle1 - idle0 >= 0.2, (idle0, idle1)
        for f in futs:
            assert check_chat_ok(f.result())["system_fingerprint"] == "fast"
        idle2 = a.metrics()["fleetgate_idle_while_waiting_seconds_total"]
        # nothing waits any more: the count stops (two 2 s answers after the first: < 6 s)
        time.sleep(0.5)
        assert a.metrics()["fleetgate_idle_while_waiting_seconds_total"] == idle2
        assert idle1 <= idle2 <= T(6), (idle1, idle2)
    # the only phone of a model is draining: its request waits with no phone for it,
    # until the phone takes work again
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as ex:
        f = ex.submit(chat, d, content="nobody", model="other-model", max_tokens=4, timeout=T(30))
        seen = wait_until(lambda: (lambda q: q if q["waiting"]["no_phone"] == 1 else None)(
            a.get("/admin/v1/queue").json()), T(10), interval=0.05)
        assert seen, a.get("/admin/v1/queue").json()
        assert seen["waiting"]["faster_phone"] == 0, seen
        rewrite_config(d, lambda c: c["replicas"][2].pop("drain"))
        assert a.post("/admin/v1/reload").status_code == 200
        assert check_chat_ok(f.result())["system_fingerprint"] == "other"


def test_events_json_and_stream(sim, gateway):
    phones = two_phones(sim)
    d, a = start(gateway, [replica(p) for p in phones])
    evs = a.get("/admin/v1/events").json()["events"]
    assert evs and all({"id", "ts", "time_ms", "type", "message"} <= set(e) for e in evs), evs
    ids = [e["id"] for e in evs]
    assert ids == sorted(ids) and len(set(ids)) == len(ids), ids
    last = ids[-1]
    # the stream replays what we have, then follows
    s = SSEReader(a.url + "/admin/v1/events", AUTH)
    try:
        assert s.resp.status_code == 200 and s.resp.headers["Content-Type"] == "text/event-stream", s.resp.headers
        assert s.wait_for(lambda r: len(r.events) >= len(evs), T(5)), s.events
        t0 = time.monotonic()
        phones[1].proc.kill()
        phones[1].check_exit = False
        got = s.wait_for(lambda r: [e for i, e in r.named("replica_state") if e["replica"] == "p2" and e["to"] == "down"],
                         T(5))
        assert got, s.events
        assert time.monotonic() - t0 < 5
        assert got[0]["from"] == "ready" and "health check failed" in got[0]["reason"], got
        assert "p2 is down" in got[0]["message"], got
    finally:
        s.close()
    # Last-Event-ID replays only what came after
    s2 = SSEReader(a.url + "/admin/v1/events", dict(AUTH, **{"Last-Event-ID": str(last)}))
    try:
        assert s2.wait_for(lambda r: r.events, T(5))
        assert all(i > last for _, i, _ in s2.events), s2.events
    finally:
        s2.close()
    after = a.get(f"/admin/v1/events?after={last}").json()["events"]
    assert after and all(e["id"] > last for e in after), after


# ---------------------------------------------------------------------------- metrics

FAMILIES = {
    "fleetgate_build_info": "gauge",
    "fleetgate_requests_total": "counter",
    "fleetgate_requests_active": "gauge",
    "fleetgate_request_duration_seconds": "histogram",
    "fleetgate_time_to_first_byte_seconds": "histogram",
    "fleetgate_queue_wait_seconds": "histogram",
    "fleetgate_queue_depth": "gauge",
    "fleetgate_queue_oldest_wait_seconds": "gauge",
    "fleetgate_upstream_failures_total": "counter",
    "fleetgate_retries_total": "counter",
    "fleetgate_failovers_total": "counter",
    "fleetgate_tokens_in_total": "counter",
    "fleetgate_tokens_out_total": "counter",
    "fleetgate_replicas": "gauge",
    "fleetgate_fleet_cost_per_day": "gauge",
    "fleetgate_replica_up": "gauge",
    "fleetgate_replica_state": "gauge",
    "fleetgate_replica_slots": "gauge",
    "fleetgate_replica_slots_busy": "gauge",
    "fleetgate_replica_prefill_tokens_per_second": "gauge",
    "fleetgate_replica_decode_tokens_per_second": "gauge",
    "fleetgate_replica_failures_total": "counter",
    "fleetgate_replica_cost_per_day": "gauge",
    "fleetgate_config_reloads_total": "counter",
    "fleetgate_plan_pass_seconds": "histogram",
}


def test_metrics_names_types_and_values_move(sim, gateway):
    good = phone(sim, "p1", slots=2)
    # p2 looks faster, so the scheduler tries it first; it answers 503 to everything
    bad = phone(sim, "p2", slots=1, decode_tps=100, prefill_tps=2000,
                fault_plan=[{"at_s": 0, "kind": "error503", "dur_s": 10000}])
    reps = [replica(good, cost_per_day=0.6), replica(bad, cost_per_day=0.4)]
    d, a = start(gateway, reps, ready=1, health={"interval_s": 0})  # no probes: p2 fails on requests
    text = a.metrics_text()
    types = fleet.prometheus_types(text)
    for name, typ in FAMILIES.items():
        assert types.get(name) == typ, (name, types.get(name))
        assert f"# HELP {name} " in text, name
    for name, typ in types.items():
        assert name.startswith("fleetgate_"), name
        assert (typ == "counter") == name.endswith("_total"), (name, typ)
    m0 = fleet.parse_prometheus(text)
    assert m0['fleetgate_fleet_cost_per_day'] == pytest.approx(1.0), m0
    assert m0['fleetgate_replica_slots{replica="p1"}'] == 2 and m0['fleetgate_replica_up{replica="p1"}'] == 1
    assert m0['fleetgate_replica_state{replica="p1",state="ready"}'] == 1
    assert m0['fleetgate_replica_state{replica="p1",state="down"}'] == 0
    assert m0['fleetgate_replica_prefill_tokens_per_second{replica="p1"}'] == good.real_prefill
    # requests: p2 answers 503 (status failure), the gateway retries on p1
    n = 8
    for i in range(n):
        check_chat_ok(chat(d, content=f"m{i}", max_tokens=5))
    chat(d, model="no-such-model")  # 404, counted under a label the client cannot invent
    m = a.metrics()
    key = f'fleetgate_requests_total{{model="{MODEL}",status="200",caller="anonymous"}}'
    assert m[key] == n, m.get(key)
    assert m['fleetgate_requests_total{model="_unknown",status="404",caller="anonymous"}'] == 1, m
    assert not any("no-such-model" in k for k in m), [k for k in m if "no-such" in k]
    assert m[f'fleetgate_tokens_out_total{{model="{MODEL}"}}'] == 5 * n, m
    assert m[f'fleetgate_tokens_in_total{{model="{MODEL}"}}'] > 0
    cnt = m[f'fleetgate_request_duration_seconds_count{{model="{MODEL}"}}']
    assert cnt == n, cnt
    assert m[f'fleetgate_request_duration_seconds_bucket{{model="{MODEL}",le="+Inf"}}'] == cnt
    buckets = [v for k, v in m.items() if k.startswith(f'fleetgate_request_duration_seconds_bucket{{model="{MODEL}"')]
    assert buckets == sorted(buckets), buckets  # cumulative
    assert m[f'fleetgate_time_to_first_byte_seconds_count{{model="{MODEL}"}}'] == n
    assert m[f'fleetgate_request_duration_seconds_sum{{model="{MODEL}"}}'] > 0
    fails = m['fleetgate_upstream_failures_total{reason="status"}'] + m['fleetgate_upstream_failures_total{reason="loading"}']
    assert fails >= 1, m
    assert m['fleetgate_retries_total{reason="status"}'] + m['fleetgate_retries_total{reason="loading"}'] == fails
    assert m['fleetgate_failovers_total{reason="status"}'] + m['fleetgate_failovers_total{reason="loading"}'] >= 1
    assert m['fleetgate_replica_failures_total{replica="p2"}'] == fails, m
    assert m['fleetgate_replica_successes_total{replica="p1"}'] == n, m
    assert m['fleetgate_replica_up{replica="p2"}'] == 0 or m['fleetgate_replica_state{replica="p2",state="loading"}'] == 1
    assert m['fleetgate_requests_active'] == 0
    # the status page's rates follow
    s = a.get("/admin/v1/status").json()["summary"]
    assert s["requests_per_s"] > 0 and s["tokens_per_s"] > 0, s
    assert s["error_rate"] == 0, s  # retried 503s never reached a client; a 404 is the client's


def test_plan_pass_histogram_counts_passes_that_found_work(sim, gateway):
    """fleetgate_plan_pass_seconds (benchmarks B6): an idle gateway plans nothing and counts
    no pass; six requests at once on a one-slot phone wait in the queue, and every one of
    them left it in a pass that found work, so at least six are counted; the histogram is
    cumulative, its +Inf bucket is its count, and its sum is the passes' time."""
    p = phone(sim, "p1", slots=1, decode_tps=100)
    d, a = start(gateway, [replica(p)])
    time.sleep(1.0)  # ten ticks and health checks: passes that find no work are not counted
    m0 = a.metrics()
    assert m0["fleetgate_plan_pass_seconds_count"] == 0, m0["fleetgate_plan_pass_seconds_count"]
    assert m0['fleetgate_plan_pass_seconds_bucket{le="+Inf"}'] == 0
    n = 6
    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        rs = list(ex.map(lambda i: chat(d, content=f"q{i}", max_tokens=20), range(n)))
    for r in rs:
        check_chat_ok(r)
    m = a.metrics()
    cnt = m["fleetgate_plan_pass_seconds_count"]
    assert cnt >= n, cnt
    assert m['fleetgate_plan_pass_seconds_bucket{le="+Inf"}'] == cnt
    buckets = [(k, v) for k, v in m.items() if k.startswith("fleetgate_plan_pass_seconds_bucket{")]
    assert len(buckets) >= 10 and 'fleetgate_plan_pass_seconds_bucket{le="0.002"}' in m, buckets
    vals = [v for _, v in buckets]
    assert vals == sorted(vals), buckets  # cumulative
    assert 0 < m["fleetgate_plan_pass_seconds_sum"] < cnt * 0.5, m["fleetgate_plan_pass_seconds_sum"]
    # passes land in the buckets by their time (how fast they are is B6's to measure, on a
    # quiet machine: under a sanitizer and a loaded machine some take more than 2 ms)
    assert 1 <= m['fleetgate_plan_pass_seconds_bucket{le="0.002"}'] <= cnt, buckets


def test_promtool_accepts_metrics_and_prometheus_scrapes_them(sim, gateway, procs, tmp_path):
    why = "Debian's prometheus package has both (deploy/setup.sh --test installs it)"
    promtool, prom = fleet.need_tool("promtool", why), fleet.need_tool("prometheus", why)
    p = phone(sim, "p1")
    d, a = start(gateway, [replica(p, cost_per_day=0.6)])
    check_chat_ok(chat(d))
    text = a.metrics_text()
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True,
                       timeout=T(30))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "" and r.stderr.strip() == "", (r.stdout, r.stderr)  # no lint either
    # a real Prometheus scrapes the admin listener with the token
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: fleetgate\n"
        f"    authorization:\n      credentials: {TOKEN}\n"
        f"    static_configs:\n      - targets: ['{HOST}:{d.ports[1]}']\n")

    def argv(ports):
        return [prom, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address={HOST}:{ports[0]}", "--log.level=warn"]
    pr = procs.spawn("prometheus", argv, ready_timeout=30, valgrind=False)  # not ours to check

    def query():
        try:
            r = requests.get(f"http://{HOST}:{pr.port}/api/v1/query", timeout=T(5),
                             params={"query": 'fleetgate_requests_total{caller="anonymous"}'})
            res = r.json()["data"]["result"]
            return res or None
        except (requests.RequestException, ValueError, KeyError):
            return None
    res = wait_until(query, T(30), interval=0.5)
    assert res, "Prometheus never got fleetgate_requests_total"
    assert res[0]["metric"]["job"] == "fleetgate" and float(res[0]["value"][1]) == 1, res
    up = requests.get(f"http://{HOST}:{pr.port}/api/v1/query", params={"query": "up"}, timeout=T(5)).json()
    assert up["data"]["result"][0]["value"][1] == "1", up


# ---------------------------------------------------------------------------- status stream and page

def test_status_stream_pushes_snapshots(sim, gateway):
    phones = two_phones(sim)
    d, a = start(gateway, [replica(p, cost_per_day=0.25) for p in phones])
    s = SSEReader(a.url + "/admin/v1/status", AUTH)
    try:
        assert s.resp.status_code == 200, s.resp.text
        hello = s.wait_for(lambda r: r.named("hello"), T(5))
        assert hello, s.events
        full = hello[0][1]
        assert {"summary", "queue", "replicas", "series", "events"} <= set(full), full.keys()
        assert full["summary"]["replicas"]["ready"] == 2 and full["summary"]["cost_per_day"] == 0.5
        assert full["series"]["interval_s"] == 10 and len(full["series"]["t"]) >= 1, full["series"]
        assert s.wait_for(lambda r: len(r.named("status")) >= 2, T(5)), s.events
        phones[0].proc.kill()
        phones[0].check_exit = False
        assert s.wait_for(lambda r: [1 for _, e in r.named("fleet") if e.get("replica") == "p1" and e["to"] == "down"],
                          T(5)), s.events
        assert s.wait_for(lambda r: r.named("status")[-1][1]["summary"]["replicas"]["down"] == 1, T(5))
    finally:
        s.close()


def test_status_page_is_self_contained(sim, gateway):
    p = phone(sim, "p1")
    d, a = start(gateway, [replica(p)])
    r = a.get("/", auth=False)
    assert r.status_code == 200, r.status_code
    html = r.text
    assert html.startswith("<!doctype html>") and "</html>" in html
    csp = r.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp, csp
    # nothing from elsewhere: no external scripts, styles, fonts or images
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html), "external reference"
    assert "@import" not in html and "url(" not in html
    assert 'name="viewport"' in html
    etag = r.headers["ETag"]
    r2 = a.get("/", auth=False, headers={"If-None-Match": etag})
    assert r2.status_code == 304, r2.status_code
    assert a.get("/index.html", auth=False).text == html
    assert a.post("/", auth=False).status_code == 405


def test_sigterm_with_streams_open_exits_cleanly(sim, gateway):
    p = phone(sim, "p1")
    d, a = start(gateway, [replica(p)])
    streams = [SSEReader(a.url + "/admin/v1/status", AUTH), SSEReader(a.url + "/admin/v1/events", AUTH)]
    try:
        assert all(s.wait_for(lambda r: r.events, T(5)) for s in streams)
        t0 = time.monotonic()
        d.send_signal(signal.SIGTERM)
        rc = d.wait_exit(T(10))
        assert rc == 0, (rc, d.logs())
        assert time.monotonic() - t0 < T(5)
        assert all(s.wait_for(lambda r: r.ended, T(5)) for s in streams)
        assert not g.log_msgs(d, "event loop closed with handles still open")
    finally:
        for s in streams:
            s.close()


def test_heartbeat_device_figures_reach_the_api_and_metrics(sim, gateway):
    """Battery and temperature come from agents' signed heartbeats (of a replica whose
    file lets its phone send them)."""
    secret = "fleet-secret-0123456789abcdef"
    p = phone(sim, "p1")
    d = gateway(lambda ports: dict(admin_config(ports, [dict(replica(p), heartbeats=True)]),
                                   fleet={"secret_env": "FLEETGATE_FLEET_SECRET"}),
                n_ports=2, env={TOKEN_ENV: TOKEN, "FLEETGATE_FLEET_SECRET": secret},
                ready=lambda dd: (g.replicas_ready(dd) or 0) >= 1)
    a = Admin(d)
    raw, h = g.heartbeat_headers({"id": "p1", "url": p.url, "models": [MODEL], "slots": 1, "busy": 0,
                                  "state": "ready", "version": "test",
                                  "device": {"battery_pct": 73, "temperature_c": 41.5, "charging": True}},
                                 secret=secret)
    r = d.post("/fleet/v1/heartbeat", data=raw, headers=h)
    assert r.status_code == 200, r.text
    p1 = a.replicas()["p1"]
    assert p1["battery_pct"] == 73 and p1["temperature_c"] == 41.5 and p1["charging"] is True, p1
    assert p1["last_heartbeat_s"] is not None and p1["last_heartbeat_s"] < 5, p1
    m = a.metrics()
    assert m['fleetgate_replica_battery_ratio{replica="p1"}'] == pytest.approx(0.73)
    assert m['fleetgate_replica_temperature_celsius{replica="p1"}'] == pytest.approx(41.5)
