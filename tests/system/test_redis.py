"""Several gateways, one fleet, one real redis-server: slot leases that never overbook a
phone, heartbeats that reach every gateway, global per-key limits, a dead gateway's leases
expiring, and Redis going away under load without a single failed request."""
import concurrent.futures
import hashlib
import re
import signal
import subprocess
import threading
import time

import pytest
import requests

import fleet
import gwutil as g
from fleet import T



@pytest.fixture(autouse=True)
def _redis_server_installed():
    fleet.need_tool("redis-server", "deploy/setup.sh --test installs it")


HOST = "127.0.0.1"
SECRET = "fleet-secret-for-the-redis-tests"
REDIS_KEY = "redis-key-shared-by-the-test-gateways-0123456789"  # redis.key_env
GW_ENV = {"FG_TEST_SECRET": SECRET, "FG_TEST_REDIS_KEY": REDIS_KEY}


def start_redis(procs, port=None, extra=()):
    """redis-server on a free port (or `port`, to restart it where it was); extra: more
    arguments (ACL users)."""
    def argv(ports):
        p = port or ports[0]
        return ["redis-server", "--port", str(p), "--bind", HOST, "--save", "",
                "--appendonly", "no", *extra]
    if port:
        d = procs.spawn("redis", argv, n_ports=0, valgrind=False,
                        ready=lambda d: fleet.port_accepts(port))
        d.redis_port = port
    else:
        d = procs.spawn("redis", argv, valgrind=False)
        d.redis_port = d.ports[0]
    return d


def rcli(redis_port, *args):
    p = subprocess.run(["redis-cli", "-p", str(redis_port), *map(str, args)],
                       capture_output=True, text=True, timeout=10)
    return p.stdout.strip()


def gateways(gateway, reps, redis_port, n=2, keys=None, fleet_section=False, redis_timeout_s=0.5,
             redis_extra=None, env=None, wait_registered=True, **kw):
    """n gateways on one Redis (ids gw0, gw1...). redis_extra: more redis settings;
    env: more environment (over GW_ENV)."""
    gws = []
    for i in range(n):
        def config(ports, i=i):
            cfg = g.gw_config(ports[0], reps, **kw)
            cfg["redis"] = {"url": f"redis://{HOST}:{redis_port}/0", "gateway_id": f"gw{i}",
                            "timeout_s": redis_timeout_s, "lease_ttl_s": 3,
                            "key_env": "FG_TEST_REDIS_KEY", **(redis_extra or {})}
            if keys:
                cfg["api_keys"] = keys
            if fleet_section:
                cfg["fleet"] = {"secret_env": "FG_TEST_SECRET", "heartbeat_timeout_s": 30}
            return cfg
        ready = len([r for r in reps if not r.get("drain")])
        check = (lambda d: (g.replicas_ready(d) or 0) >= ready) if ready else None
        gws.append(gateway(config, name=f"gw{i}", ready=check, env={**GW_ENV, **(env or {})}))
    # both gateways registered in Redis
    if wait_registered:
        fleet.wait_until(lambda: rcli(redis_port, "ZCARD", "fleetgate:gateways") == str(n), T(10),
                         what="gateways registered in redis")
    return gws


class MaxProcessing:
    """Polls every sim's /metrics in the background; remembers the most requests each ran
    at once and whether any request was ever deferred inside a phone."""

    def __init__(self, phones):
        self.phones = phones
        self.max = {p.id: 0 for p in phones}
        self.deferred = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        s = requests.Session()
        for _ in range(100000):
            if self._stop.is_set():
                return
            for p in self.phones:
                try:
                    t = s.get(p.url + "/metrics", timeout=1).text
                except requests.RequestException:
                    continue
                m = re.search(r"(?m)^llamacpp:requests_processing (\S+)", t)
                d = re.search(r"(?m)^llamacpp:requests_deferred (\S+)", t)
                if m:
                    self.max[p.id] = max(self.max[p.id], int(float(m.group(1))))
                if d:
                    self.deferred = max(self.deferred, int(float(d.group(1))))
            time.sleep(0.005)

    def stop(self):
        self._stop.set()
        self._t.join(10)


def post(gw, body=None, headers=None, timeout=None):
    body = body or fleet.chat_body("hello", model=g.MODEL, max_tokens=6)
    return requests.post(gw.url + "/v1/chat/completions", json=body, headers=headers or {},
                         timeout=timeout or T(60))


def test_two_gateways_never_overbook_a_phone(procs, sim, gateway):
    r = start_redis(procs)
    phones = [g.phone(sim, f"p{i}", slots=1, decode_tps=4) for i in range(3)]
    gws = gateways(gateway, [g.replica(p) for p in phones], r.redis_port)
    watch = MaxProcessing(phones)
    try:
        with concurrent.futures.ThreadPoolExecutor(30) as ex:
            codes = list(ex.map(lambda i: post(gws[i % 2]).status_code, range(60)))
    finally:
        watch.stop()
    assert codes == [200] * 60
    assert all(v <= 1 for v in watch.max.values()), watch.max
    assert max(watch.max.values()) == 1
    assert watch.deferred == 0, "a phone queued a request inside itself: it was overbooked"
    # both gateways did real work
    for gw in gws:
        assert len(g.log_msgs(gw, "request")) >= 10


def test_heartbeat_to_a_serves_through_b(procs, sim, gateway):
    r = start_redis(procs)
    phone = g.phone(sim, "hb-phone", slots=2)
    gws = gateways(gateway, [], r.redis_port, fleet_section=True)
    body, h = g.heartbeat_headers({"id": "hb-phone", "url": phone.url, "models": [g.MODEL], "slots": 2,
                                   "n_ctx": 4096, "state": "ready"}, secret=SECRET)
    resp = requests.post(gws[0].url + "/fleet/v1/heartbeat", data=body, headers=h, timeout=T(5))
    assert resp.status_code == 200, resp.text
    fleet.wait_until(lambda: (g.replicas_ready(gws[1]) or 0) >= 1, T(5), what="phone known to B")
    res = post(gws[1])
    assert res.status_code == 200 and res.headers["x-fleetgate-replica"] == "hb-phone"
    # the same heartbeat replayed at B is refused too: replay protection is shared
    resp = requests.post(gws[1].url + "/fleet/v1/heartbeat", data=body, headers=h, timeout=T(5))
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "replayed_heartbeat"


def test_rate_limit_holds_across_gateways(procs, sim, gateway):
    r = start_redis(procs)
    phone = g.phone(sim, "p0", slots=4, decode_tps=100)
    key = "sk-shared-limit-0123"
    keys = [{"name": "team", "key_sha256": hashlib.sha256(key.encode()).hexdigest(), "rpm": 6}]
    gws = gateways(gateway, [g.replica(phone)], r.redis_port, keys=keys)
    codes = [post(gws[i % 2], headers={"x-api-key": key}).status_code for i in range(10)]
    assert codes.count(200) == 6, codes
    assert codes.count(429) == 4, codes
    res = post(gws[1], headers={"x-api-key": key})
    g.check_error(res, 429, "rate_limit_exceeded", retry_after=True)
    assert 5 <= int(res.headers["Retry-After"]) <= 11  # one request per 10 s


def test_redis_away_each_gateway_refills_tpm_at_its_share(procs, sim, gateway):
    """With Redis gone, two gateways each count a key's tokens per minute with half the
    limit, and the bucket refills at that half also while a request runs: a long answer
    must not earn this gateway tokens at the full rate (then both gateways together would
    let through twice the limit)."""
    r = start_redis(procs)
    phone = g.phone(sim, "p0", slots=2, decode_tps=8)  # 80 real tokens/s
    key = "sk-share-tpm-0123"
    tpm = 600  # 300 a minute, 5 a second, for each of the two gateways
    keys = [{"name": "team", "key_sha256": hashlib.sha256(key.encode()).hexdigest(), "tpm": tpm}]
    gws = gateways(gateway, [g.replica(phone)], r.redis_port, keys=keys)
    time.sleep(2.5)  # each gateway counts its peers in Redis every 2 s
    r.send_signal(9)
    r.check_exit = False
    hdr = {"x-api-key": key}
    # the gateway notices with its next command (its heartbeat in Redis)
    fleet.wait_until(lambda: "serving from this gateway's own view" in gws[0].logs(tail=10 ** 6),
                     T(10), what="gateway 0 degraded")
    t0 = time.monotonic()
    long = post(gws[0], body=fleet.chat_body("a long one", model=g.MODEL, max_tokens=400),
                headers=hdr)
    took = time.monotonic() - t0
    assert long.status_code == 200, long.text
    used = long.json()["usage"]["total_tokens"]
    assert used > 300 and took >= 3, (used, took)
    # this gateway's bucket held 300 (its share) and refilled 5 a second while the answer
    # ran: the key is now about used - 300 - 5 x took in debt. With the full rate it would
    # be 10 x took less.
    res = post(gws[0], headers=hdr)
    g.check_error(res, 429, "rate_limit_exceeded", retry_after=True)
    want = (used - 299) / 5  # the debt at the share, refilled at the share
    ra = int(res.headers["Retry-After"])
    assert want - 2 <= ra <= want + 1, (ra, want, used, took)


def test_dead_gateway_leases_expire(procs, sim, gateway):
    r = start_redis(procs)
    phone = g.phone(sim, "solo", slots=1, decode_tps=2)  # 20 real tokens/s
    gws = gateways(gateway, [g.replica(phone)], r.redis_port)
    long_body = fleet.chat_body("a long one", model=g.MODEL, max_tokens=400)  # ~20 s
    def long_request():
        try:
            requests.post(gws[0].url + "/v1/chat/completions", json=long_body, timeout=T(60))
        except requests.RequestException:
            pass  # its gateway is killed under it: that is the point

    t = threading.Thread(target=long_request, daemon=True)
    t.start()
    fleet.wait_until(lambda: rcli(r.redis_port, "ZCARD", "fleetgate:lease:solo") == "1", T(5),
                     what="A's lease in redis")
    gws[0].send_signal(9)
    gws[0].check_exit = False
    t0 = time.monotonic()
    res = post(gws[1], timeout=T(30))
    took = time.monotonic() - t0
    assert res.status_code == 200
    # B waited for A's lease to expire (3 s), then used the slot
    assert took <= T(3 + 4), took


def test_redis_stopped_under_load_then_back(procs, sim, gateway):
    r = start_redis(procs)
    phones = [g.phone(sim, f"p{i}", slots=2, decode_tps=10) for i in range(3)]
    gws = gateways(gateway, [g.replica(p) for p in phones], r.redis_port)
    codes = []
    lock = threading.Lock()
    stop = threading.Event()

    def load(k):
        for i in range(1000):
            if stop.is_set():
                return
            c = post(gws[(k + i) % 2]).status_code
            with lock:
                codes.append(c)

    threads = [threading.Thread(target=load, args=(k,), daemon=True) for k in range(8)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    port = r.redis_port
    r.send_signal(9)
    r.check_exit = False
    time.sleep(2.5)
    # Redis comes back on the same port; the gateways reconnect and resync
    r2 = start_redis(procs, port=port)
    fleet.wait_until(lambda: rcli(r2.redis_port, "ZCARD", "fleetgate:gateways") == "2", T(15),
                     what="gateways back in redis")
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join(T(60))
    assert len(codes) > 40
    assert set(codes) == {200}, {c: codes.count(c) for c in set(codes)}
    for gw in gws:
        logs = gw.logs(tail=10 ** 7)
        assert "serving from this gateway's own view" in logs
        assert logs.count("redis: connected") >= 2
    # the shared counts are right again: a running request holds exactly one lease
    slow = fleet.chat_body("hold a slot", model=g.MODEL, max_tokens=200)
    t = threading.Thread(target=lambda: requests.post(gws[0].url + "/v1/chat/completions",
                                                      json=slow, timeout=T(60)), daemon=True)
    t.start()

    def leases():
        return sum(int(rcli(port, "ZCARD", f"fleetgate:lease:{p.id}") or 0) for p in phones)
    fleet.wait_until(lambda: leases() == 1, T(5), what="one lease for one running request")
    t.join(T(60))


def test_a_client_gone_while_redis_decides_the_lease_never_reaches_the_phone(procs, gateway):
    """The lease is asked of Redis before the request goes out. A client that leaves while
    Redis is slow to answer must not have its request sent once the answer comes, also
    when both reach the gateway in one loop turn (a regression test for the job's one
    timer, which the answer re-armed as a watchdog over the pending finish; which order
    the kernel hands the two events over in is not under the test's control)."""
    phone = g.ScriptedPhone(lambda b, n: (200, g.completion()), id="p")
    try:
        red = start_redis(procs)
        rep = {"id": "p", "url": phone.url, "models": [g.MODEL], "slots": 2,
               "prefill_tps": 5000, "decode_tps": 500}
        # Redis is slow here, not gone: the gateway waits for its answer
        (gw,) = gateways(gateway, [rep], red.redis_port, n=1, redis_timeout_s=10)
        assert gw.post(g.CHAT, json=fleet.chat_body("warm", model=g.MODEL)).status_code == 200
        assert phone.n == 1
        rcli(red.redis_port, "CLIENT", "PAUSE", "1000", "ALL")  # Redis holds every command
        conn = g.RawConn(gw.ports[0])
        conn.send(g.chat_bytes(gw.ports[0], headers={"x-request-id": "gone-early"}))
        time.sleep(0.3)  # the gateway has asked Redis for the lease
        # The client's leaving and Redis's answer reach the gateway in one loop turn, the
        # leaving first: the gateway is stopped while both happen (the pause ends by itself).
        gw.proc.send_signal(signal.SIGSTOP)
        try:
            conn.close()
            time.sleep(1.2)
        finally:
            gw.proc.send_signal(signal.SIGCONT)
        time.sleep(T(2))
        assert phone.n == 1, phone.requests
        log = g.access_log(gw, "gone-early")
        assert log["status"] == 499 and log.get("client_gone") is True, log
        # and the gateway goes on serving
        assert gw.post(g.CHAT, json=fleet.chat_body("after", model=g.MODEL)).status_code == 200
    finally:
        phone.close()


# A Redis ACL user with only what the gateway needs (docs/scaling.md#redis-access): its
# commands, keys and channels under the prefix; the default user is switched off.
ACL_USER = "fleetgate"
ACL_PASSWORD = "acl-password-for-the-gateway-user"
ACL_RULE = (f"{ACL_USER} on >{ACL_PASSWORD} resetchannels ~fleetgate:* &fleetgate:* -@all "
            "+ping +auth +select +eval +time +zadd +zrem +zcard +zscore +zremrangebyscore +pexpire "
            "+hset +hmget +hgetall +get +set +sadd +srem +smembers +publish +subscribe")


def acl_redis(procs, tmp_path):
    """redis-server with an ACL file as docs/scaling.md shows it."""
    acl = tmp_path / "users.acl"
    acl.write_text(f"user default off\nuser {ACL_RULE}\n")
    return start_redis(procs, extra=["--aclfile", str(acl)])


def acli(redis_port, *args):
    p = subprocess.run(["redis-cli", "-p", str(redis_port), "--user", ACL_USER, "--pass", ACL_PASSWORD,
                        "--no-auth-warning", *map(str, args)], capture_output=True, text=True, timeout=10)
    return p.stdout.strip()


def test_gateways_work_as_a_least_privilege_acl_user(procs, sim, gateway, tmp_path):
    """The gateway authenticates as an ACL user that may run only its own commands on its
    own prefix: leases, limits, heartbeats shared through Redis and drains over pub/sub
    all work, and the user cannot touch anything else (so the rule is a real limit)."""
    r = acl_redis(procs, tmp_path)
    # the rule bites: no default user, no other keys, no dangerous commands
    assert "NOAUTH" in rcli(r.redis_port, "PING") or "WRONGPASS" in rcli(r.redis_port, "PING")
    assert "NOPERM" in acli(r.redis_port, "SET", "other:key", "x")
    assert "NOPERM" in acli(r.redis_port, "FLUSHALL")
    assert "NOPERM" in acli(r.redis_port, "CONFIG", "GET", "*")
    phone = g.phone(sim, "acl-p0", slots=2, decode_tps=100)
    key = "sk-acl-limit-0123456"
    keys = [{"name": "team", "key_sha256": hashlib.sha256(key.encode()).hexdigest(), "rpm": 4}]
    gws = gateways(gateway, [g.replica(phone)], r.redis_port, keys=keys, fleet_section=True,
                   redis_extra={"username": ACL_USER, "password_env": "FG_TEST_REDIS_PASSWORD"},
                   env={"FG_TEST_REDIS_PASSWORD": ACL_PASSWORD}, wait_registered=False)
    fleet.wait_until(lambda: acli(r.redis_port, "ZCARD", "fleetgate:gateways") == "2", T(10),
                     what="gateways registered in redis as the ACL user")
    # the rate limit is global: leases and buckets (Lua) run under the ACL user
    codes = [post(gws[i % 2], headers={"x-api-key": key}).status_code for i in range(6)]
    assert codes.count(200) == 4 and codes.count(429) == 2, codes
    # a heartbeat accepted by A is stored and relayed: B serves the phone
    hb_phone = g.phone(sim, "acl-hb", slots=1)
    body, h = g.heartbeat_headers({"id": "acl-hb", "url": hb_phone.url, "models": [g.MODEL], "slots": 1,
                                   "n_ctx": 4096, "state": "ready"}, secret=SECRET)
    resp = requests.post(gws[0].url + "/fleet/v1/heartbeat", data=body, headers=h, timeout=T(5))
    assert resp.status_code == 200, resp.text
    fleet.wait_until(lambda: (g.replicas_ready(gws[1]) or 0) >= 2, T(5), what="phone known to B")
    for gw in gws:
        logs = gw.logs(tail=10 ** 7)
        assert "redis: connected" in logs and "NOPERM" not in logs and "AUTH" not in logs, logs[-3000:]


def test_gateways_keep_cache_scopes_apart_on_one_phone(procs, sim, gateway):
    """Keys' cache scopes across gateways (docs/security.md "Tenants' prompts"). A phone
    whose agent keeps scopes apart decides for every gateway: the victim warms it through
    gw0, a key of its scope reuses it through gw1, the attacker's guess through gw1 reuses
    nothing, and Redis holds nothing about it. A phone without such an agent is decided in
    Redis with each lease, and what Redis does not know (no key: a new phone, Redis
    flushed) is nobody's to reuse: with several scopes it serves uncached."""
    rd = start_redis(procs)
    p = g.phone(sim, "p0", prefill_tps=200, decode_tps=50)
    keys = [{"name": n, "key_sha256": hashlib.sha256(n.encode()).hexdigest(), **extra}
            for n, extra in (("victim-key", {"cache_scope": "clinic"}),
                             ("colleague-key", {"cache_scope": "clinic"}), ("attacker-key", {}))]
    secret = "Patient record: diagnosis=HIV-positive; " + fleet.make_prompt(600, tag="tail")

    def cached(gw, who):
        r = g.chat(gw, content=secret, max_tokens=2, headers={"Authorization": f"Bearer {who}"},
                   timeout=T(30))
        return g.check_chat_ok(r)["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)

    gw0, gw1 = gateways(gateway, [g.replica(p, agent=True)], rd.redis_port, keys=keys)
    assert cached(gw0, "victim-key") == 0
    assert cached(gw0, "victim-key") > 500
    assert cached(gw1, "colleague-key") > 500
    assert cached(gw1, "attacker-key") < 50
    assert cached(gw0, "victim-key") < 50  # the slot holds the attacker's guess now
    assert rcli(rd.redis_port, "EXISTS", "fleetgate:cache:p0") == "0"
    gw0.stop()
    gw1.stop()

    # the same phone as a bare engine (not checked as an agent): decided in Redis, unknown
    gw0, gw1 = gateways(gateway, [g.replica(p)], rd.redis_port, keys=keys)
    assert cached(gw0, "victim-key") == 0
    assert cached(gw0, "victim-key") == 0
    assert cached(gw1, "attacker-key") == 0
    assert rcli(rd.redis_port, "GET", "fleetgate:cache:p0") == "*"
