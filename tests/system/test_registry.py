"""The replica registry and health: replica files edited while the gateway serves, broken
edits refused, --check-config on each kind of mistake, active health checks (a killed
phone leaves and returns, a loading phone waits, a busy phone stays), signed heartbeats."""
import concurrent.futures
import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests

import fleet
import gwutil as g
from fleet import T

SECRET = "registry-test-fleet-secret"


class SteadyLoad:
    """A steady stream of small requests from a few threads, recording every status."""

    def __init__(self, gw, threads=4, max_tokens=4):
        self.gw, self.codes, self.replicas = gw, [], []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.max_tokens = max_tokens
        self.ts = [threading.Thread(target=self.run, args=(k,), daemon=True)
                   for k in range(threads)]
        for t in self.ts:
            t.start()

    def run(self, k):
        s = requests.Session()
        for i in range(100000):
            if self.stop.is_set():
                return
            # different prompts: no phone is preferred for a cached prefix
            body = fleet.chat_body(f"steady {k} {i}", model=g.MODEL, max_tokens=self.max_tokens)
            try:
                r = s.post(self.gw.url + "/v1/chat/completions", json=body, timeout=T(30))
                code, rep = r.status_code, r.headers.get("x-fleetgate-replica")
            except requests.RequestException as e:
                code, rep = str(e), None
            with self.lock:
                self.codes.append(code)
                self.replicas.append((time.monotonic(), rep))

    def served_by(self, rid, since=0.0):
        with self.lock:
            return sum(1 for t, r in self.replicas if r == rid and t >= since)

    def finish(self):
        self.stop.set()
        for t in self.ts:
            t.join(T(30))
        return self.codes


def spread(gw, n, max_tokens=20):
    """Replicas that served n concurrent requests with different prompts."""
    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        rs = list(ex.map(lambda i: g.chat(gw, content=f"spread {i} {time.monotonic()}",
                                          max_tokens=max_tokens), range(n)))
    assert all(r.status_code == 200 for r in rs), [r.status_code for r in rs]
    return {r.headers["x-fleetgate-replica"] for r in rs}


def registry_gateway(gateway, tmp_path, files, **kw):
    """A gateway with replicas_dir = tmp_path/replicas.d holding `files` {name: obj}."""
    rdir = tmp_path / "replicas.d"
    rdir.mkdir(exist_ok=True)
    for name, obj in files.items():
        (rdir / name).write_text(json.dumps(obj))

    def config(ports):
        cfg = g.gw_config(ports[0], [], **kw)
        del cfg["replicas"]
        cfg["replicas_dir"] = str(rdir)
        return cfg
    n = sum(1 for o in files.values() for _ in (o if isinstance(o, list) else [o]))
    gw = gateway(config, ready=lambda d: (g.replicas_ready(d) or 0) >= n)
    gw.rdir = rdir
    return gw


def test_edit_replica_files_under_load(sim, gateway, tmp_path):
    a, b, c = (g.phone(sim, n, slots=2, decode_tps=20) for n in ("pa", "pb", "pc"))
    gw = registry_gateway(gateway, tmp_path, {"a.json": g.replica(a), "b.json": g.replica(b)})
    load = SteadyLoad(gw, threads=6)  # more than a and b's 4 slots
    time.sleep(1.0)
    # add c
    t_add = time.monotonic()
    (gw.rdir / "c.json").write_text(json.dumps(g.replica(c)))
    fleet.wait_until(lambda: load.served_by("pc") > 0, T(5), what="the added phone gets work")
    assert time.monotonic() - t_add < T(5)
    # edit b (slots 2 -> 1): applied, no failures
    (gw.rdir / "b.json").write_text(json.dumps(g.replica(b, slots=1)))
    fleet.wait_until(lambda: any('"changed"' in ln and "pb" in ln for ln in
                                 gw.logs(tail=10 ** 7).splitlines()), T(5), what="b changed")
    # remove a: it finishes what runs and gets nothing new
    (gw.rdir / "a.json").unlink()
    fleet.wait_until(lambda: any('"removed"' in ln and "pa" in ln for ln in
                                 gw.logs(tail=10 ** 7).splitlines()), T(5), what="a removed")
    t_rm = time.monotonic() + 0.5  # requests sent before the reload may still finish on a
    time.sleep(2.0)
    codes = load.finish()
    assert codes and set(codes) == {200}, {c: codes.count(c) for c in set(codes)}
    assert load.served_by("pa", since=t_rm) == 0
    assert load.served_by("pb", since=t_rm) > 0 and load.served_by("pc", since=t_rm) > 0
    assert g.log_msgs(gw, "replica left the registry", replica="pa")


def test_broken_edit_changes_nothing_until_fixed(sim, gateway, tmp_path):
    a, b = g.phone(sim, "pa"), g.phone(sim, "pb")
    gw = registry_gateway(gateway, tmp_path, {"a.json": g.replica(a)})
    # a syntax error, then a duplicate id: both refused, with file:line:col
    bad = gw.rdir / "b.json"
    bad.write_text('{"id": "pb", "url": "%s",\n "models": ["%s"] ' % (b.url, g.MODEL))
    fleet.wait_until(lambda: g.log_msgs(gw, "configuration reload refused; the running "
                                            "configuration is unchanged"), T(5), what="refusal")
    err = g.log_msgs(gw, "configuration reload refused; the running configuration is unchanged")[-1]
    assert f"{bad}:2:" in err["errors"] and "syntax error" in err["errors"], err
    bad.write_text(json.dumps(g.replica(a, url=b.url)))  # duplicate id "pa"
    fleet.wait_until(lambda: len(g.log_msgs(gw, "configuration reload refused; the running "
                                                "configuration is unchanged")) >= 2, T(5))
    err = g.log_msgs(gw, "configuration reload refused; the running configuration is unchanged")[-1]
    assert "duplicate replica id" in err["errors"] and "a.json" in err["errors"], err
    # the running set is untouched: only pa serves
    for _ in range(4):
        assert g.chat(gw).headers["x-fleetgate-replica"] == "pa"
    # fixed: applied (two at once: each phone has one slot)
    bad.write_text(json.dumps(g.replica(b)))
    fleet.wait_until(lambda: (g.replicas_ready(gw) or 0) == 2, T(5), what="pb added")
    assert spread(gw, 2) == {"pa", "pb"}


def test_a_configured_model_waits_for_its_phone(sim, gateway, tmp_path):
    """A model the config's `models` names is served once a phone lists it: meanwhile its
    requests wait in the queue until their deadline, while a model that nobody names and no
    phone serves is refused at once."""
    a = g.phone(sim, "pa")
    b = g.phone(sim, "pb", model="later-model")
    gw = registry_gateway(gateway, tmp_path, {"a.json": g.replica(a)},
                          models=[{"name": "later-model"}])
    g.check_error(g.chat(gw, model="nobody-model"), 404, "model_not_found")
    t0 = time.monotonic()
    r = g.chat(gw, model="later-model", headers={"x-fleetgate-timeout": "1"}, timeout=T(10))
    g.check_error(r, 503, "deadline_exceeded", retry_after=True,
                  what="named, no phone yet: it waited for its deadline")
    assert time.monotonic() - t0 >= 0.9
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        waiting = ex.submit(g.chat, gw, model="later-model", timeout=T(30))
        time.sleep(0.5)
        assert not waiting.done()
        (gw.rdir / "b.json").write_text(json.dumps(g.replica(b)))  # its phone joins
        g.check_chat_ok(waiting.result(), "pb")
    assert g.chat(gw).status_code == 200  # the other model as before


def test_sighup_reload(sim, gateway, tmp_path):
    a, b = g.phone(sim, "pa"), g.phone(sim, "pb")
    gw = g.start_gateway(gateway, [g.replica(a)])
    cfg = json.loads(Path(gw.config_path).read_text())
    cfg["replicas"].append(g.replica(b))
    Path(gw.config_path).write_text(json.dumps(cfg))
    gw.send_signal(signal.SIGHUP)
    fleet.wait_until(lambda: (g.replicas_ready(gw) or 0) == 2, T(5), what="pb added on SIGHUP")
    rec = g.log_msgs(gw, "configuration reloaded")[-1]
    assert rec["trigger"] == "SIGHUP" and rec["added"] == ["pb"]


CHECKS = [
    # (file text, expected line:col, expected words)
    ('{\n  "listen": "127.0.0.1:1",\n  "queue": {"max": 10,}\n}\n', "3:24", "syntax error"),
    ('{\n  "replicas": [\n    {"id": "x", "url": "https://h", "models": ["m"], "sloots": 1}\n  ]\n}\n',
     "3:54", "replicas[0].sloots: unknown key"),
    ('{\n  "replicas": [{"id": "x", "url": "https://h",\n    "models": ["m"], "slots": "2"}]\n}\n',
     "3:31", "replicas[0].slots: expected an integer"),
    ('{"replicas": [{"id": "x", "url": "gopher://h", "models": ["m"]}]}\n', "1:34",
     "replicas[0].url"),
    ('{"replicas": [{"id": "x", "url": "https://h", "models": ["m"]},\n'
     '              {"id": "x", "url": "https://g", "models": ["m"]}]}\n', "2:22",
     "duplicate replica id"),
    ('{"replicas": [{"id": "x", "url": "https://h", "models": ["m"],\n'
     '   "token_env": "FLEETGATE_NOT_SET_ANYWHERE"}]}\n', "2:17",
     "FLEETGATE_NOT_SET_ANYWHERE is not set"),
    # the URL policy (docs/security.md): https unless allowed, nothing but a base
    ('{"replicas": [{"id": "x", "url": "http://h", "models": ["m"]}]}\n', "1:34",
     "replicas[0].url: plain http:// is not allowed (set upstream.allow_http)"),
    ('{"upstream": {"allow_http": true},\n "replicas": [{"id": "x", "url": "http://10.0.0.7:9200/idx/_search?q=",'
     ' "models": ["m"]}]}\n', "2:34", "replicas[0].url: the URL may not have a query"),
    ('{"upstream": {"allow_addresses": ["127.0.0.0/8", "::1"]},\n'
     ' "replicas": [{"id": "x", "url": "https://a:b@h", "models": ["m"]}]}\n', "2:34",
     "replicas[0].url: the URL may not hold userinfo"),
    ('{"upstream": {"allow_addresses": ["127.0.0.1/8"]}}\n', "1:35",
     "upstream.allow_addresses[0]: the address has bits set past the prefix length"),
]


@pytest.mark.parametrize("text,where,words", CHECKS)
def test_check_config_points_at_the_mistake(tmp_path, text, where, words):
    f = tmp_path / "bad.json"
    f.write_text(text)
    p = subprocess.run([fleet.gateway_bin(), "--check-config", str(f)], capture_output=True,
                       text=True, timeout=10)
    assert p.returncode == 1
    assert f"{f}:{where}: " in p.stderr and words in p.stderr, p.stderr


def test_check_config_in_a_replica_file(tmp_path):
    (tmp_path / "replicas.d").mkdir()
    (tmp_path / "replicas.d" / "p.json").write_text('[{"id": "a", "url": "https://h",\n'
                                                    '  "models": "m"}]\n')
    main = tmp_path / "main.json"
    main.write_text('{"replicas_dir": "replicas.d"}\n')
    p = subprocess.run([fleet.gateway_bin(), "--check-config", str(main)], capture_output=True,
                       text=True, timeout=10)
    assert p.returncode == 1
    assert "replicas.d/p.json:2:13: [0].models: expected an array" in p.stderr, p.stderr


def test_killed_phone_leaves_and_returns(procs, sim, gateway):
    a = g.phone(sim, "stay")
    b = g.phone(sim, "flaky", check_exit=False)
    health = {"interval_s": 0.3, "timeout_s": 0.5, "rise": 2, "fall": 2, "down_interval_s": 0.3}
    gw = g.start_gateway(gateway, [g.replica(a), g.replica(b)], health=health)
    port = b.ports[0]
    b.send_signal(signal.SIGKILL)
    t0 = time.monotonic()
    fleet.wait_until(lambda: g.log_msgs(gw, "replica state changed", replica="flaky", to="down"),
                     T(5), what="flaky down")
    # within interval x fall (0.6 s) plus a probe timeout and jitter
    assert time.monotonic() - t0 < T(2.5)
    assert all(g.chat(gw).headers["x-fleetgate-replica"] == "stay" for _ in range(5))
    # it comes back on the same port
    b2 = restart_sim(procs, port, "flaky")
    # its second "ready" (the first was at start)
    fleet.wait_until(lambda: len(g.log_msgs(gw, "replica state changed", replica="flaky",
                                            to="ready")) >= 2, T(8), what="flaky back")
    assert "flaky" in spread(gw, 2)
    assert b2.alive()


def restart_sim(procs, port, rid):
    """A sim on a given port (the one a killed phone had)."""
    argv = fleet.sim_argv(port, model=g.MODEL, slots=1, prefill_tps=200, decode_tps=10,
                          time_scale=g.SCALE, id=rid)
    return procs.spawn(rid + "-again", lambda ports: argv, n_ports=0,
                       ready=lambda d: fleet.port_accepts(port))


def test_loading_phone_gets_no_work_until_ready(sim, gateway):
    ready = g.phone(sim, "ready")
    loading = g.phone(sim, "loading", loading_s=30)  # 3 s real at time scale 10
    gw = g.start_gateway(gateway, [g.replica(ready), g.replica(loading)], ready=1,
                         health={"interval_s": 0.3})
    t0 = time.monotonic()
    served = [g.chat(gw).headers["x-fleetgate-replica"] for _ in range(6)]
    assert served == ["ready"] * 6
    assert time.monotonic() - t0 < 2.5
    fleet.wait_until(lambda: (g.replicas_ready(gw) or 0) == 2, T(8), what="loading phone ready")
    assert spread(gw, 2) == {"ready", "loading"}


def test_long_prefill_is_not_ejected(sim, gateway):
    slow = g.phone(sim, "slow", slots=1, prefill_tps=20)  # 200 tokens/s real
    gw = g.start_gateway(gateway, [g.replica(slow)],
                         health={"interval_s": 0.2, "timeout_s": 0.5, "fall": 2})
    # 1,200 prompt tokens: a 6 s prefill, many probe intervals long
    r = g.chat(gw, content="x" * 4800, max_tokens=2, timeout=T(60))
    assert r.status_code == 200
    assert not g.log_msgs(gw, "replica state changed", replica="slow", to="down")


def heartbeat(gw, body, ts=None, secret=SECRET, sig=None, key=None):
    raw, h = g.heartbeat_headers(body, secret=secret, key=key, ts=ts, sig=sig)
    return requests.post(gw.url + "/fleet/v1/heartbeat", data=raw, timeout=T(5), headers=h)


def test_heartbeats_register_refuse_and_expire(sim, gateway):
    phone = g.phone(sim, "hb1", slots=2)
    fleet_cfg = {"secret_env": "FG_SECRET", "heartbeat_timeout_s": 1.5,
                 "heartbeat_interval_s": 0.5}
    gw = gateway(lambda ports: dict(g.gw_config(ports[0], []), fleet=fleet_cfg),
                 env={"FG_SECRET": SECRET})
    body = {"id": "hb1", "url": phone.url, "models": [g.MODEL], "slots": 2, "n_ctx": 4096,
            "prefill_tps": 2000, "decode_tps": 100, "state": "ready",
            "device": {"battery_pct": 77, "charging": False}}
    # refused: wrong signature, old timestamp, bad body, and a replay: none registers
    r = heartbeat(gw, body, secret="not-the-fleet-secret")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_signature"
    r = heartbeat(gw, body, ts=int(time.time() * 1000) - 120_000)
    assert r.status_code == 401 and r.json()["error"]["code"] == "stale_timestamp"
    r = heartbeat(gw, dict(body, slots="two"))
    assert r.status_code == 400
    assert g.replicas_ready(gw) == 0
    g.check_error(g.chat(gw), 404, "model_not_found")
    # a good one registers the phone; it serves
    ts = int(time.time() * 1000)
    r = heartbeat(gw, body, ts=ts)
    assert r.status_code == 200, r.text
    ans = r.json()
    token = ans.pop("replica_token")
    assert ans == {"id": "hb1", "accepted": True, "enrolment": "pinned", "interval_s": 0.5,
                   "drain": False, "state": "ready"}, ans
    # the phone's own token, derived from its id and key (the next answer names the same)
    assert token.startswith("fgr-") and len(token) == 68, token
    assert g.chat(gw).headers["x-fleetgate-replica"] == "hb1"
    r = heartbeat(gw, body, ts=ts)
    assert r.status_code == 401 and r.json()["error"]["code"] == "replayed_heartbeat"
    # silence: it leaves rotation
    fleet.wait_until(lambda: g.log_msgs(gw, "replica state changed", replica="hb1", to="down"),
                     T(5), what="hb1 down after silence")
    assert (g.replicas_ready(gw) or 0) == 0
    # and comes back with its next heartbeat
    assert heartbeat(gw, body).status_code == 200
    assert g.chat(gw).headers["x-fleetgate-replica"] == "hb1"
