"""Attacks through Redis: someone who can write to the gateways' Redis (a leaked password,
a shared Redis, a compromised host next to it) publishes forged drain and state messages,
replays real ones, plants heartbeats and learned speeds, or runs a gateway with the wrong
key. Every message and shared value a gateway acts on is sealed (redis.key_env): forged,
replayed, stale or moved ones change nothing, are counted in
fleetgate_redis_messages_refused_total{reason} and logged, while the real thing (a drain
through the admin API on gateway A) still reaches gateway B. And a wrong Redis password
means degraded mode, not an outage."""
import json
import socket
import subprocess
import threading
import time

import pytest
import requests

import fleet
import gwutil as g
from fleet import T

HOST = "127.0.0.1"
SECRET = "fleet-secret-for-the-redis-attack-tests"
KEY = "the-gateways-shared-redis-key-0123456789abcdef"
OTHER_KEY = "another-key-that-is-not-the-fleets-0123456789"
ADMIN_TOKEN = "admin-token-for-the-attack-tests"
CHAN = "fleetgate:events"


@pytest.fixture(autouse=True)
def _redis_server_installed():
    fleet.need_tool("redis-server", "deploy/setup.sh --test installs it")


def start_redis(procs, extra=()):
    return procs.spawn("redis", lambda p: ["redis-server", "--port", str(p[0]), "--bind", HOST, "--save", "",
                                           "--appendonly", "no", *extra], valgrind=False)


def rcli(redis, *args, password=None):
    auth = ["-a", password, "--no-auth-warning"] if password else []
    p = subprocess.run(["redis-cli", "-p", str(redis.ports[0]), *auth, *map(str, args)],
                       capture_output=True, text=True, timeout=10)
    return p.stdout.strip()


class Subscriber:
    """SUBSCRIBE on the events channel with a raw RESP client: keeps every message's
    bytes exactly (they hold newlines), so a test can publish one again."""

    def __init__(self, redis):
        self.sock = socket.create_connection((HOST, redis.ports[0]), timeout=T(10))
        self.sock.sendall(f"*2\r\n$9\r\nSUBSCRIBE\r\n${len(CHAN)}\r\n{CHAN}\r\n".encode())
        self.buf = b""
        self.messages = []
        self.lock = threading.Lock()
        self._read_reply()  # the subscribe confirmation
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _read_reply(self):
        line = self._line()
        if line[:1] == b"*":
            return [self._read_reply() for _ in range(int(line[1:]))]
        if line[:1] == b"$":
            n = int(line[1:])
            while len(self.buf) < n + 2:
                self.buf += self.sock.recv(65536)
            data, self.buf = self.buf[:n], self.buf[n + 2:]
            return data
        return line[1:]

    def _run(self):
        self.sock.settimeout(None)
        try:
            while True:
                r = self._read_reply()
                if isinstance(r, list) and r[0] == b"message":
                    with self.lock:
                        self.messages.append(r[2])
        except (OSError, EOFError):
            pass

    def wait_for(self, needle):
        def find():
            with self.lock:
                return next((m for m in self.messages if needle in m), None)
        return fleet.wait_until(find, T(5), what=f"a message holding {needle!r}")

    def close(self):
        self.sock.close()


def publish(redis, message: bytes):
    """PUBLISH raw bytes (binary-safe, as Redis takes them)."""
    with socket.create_connection((HOST, redis.ports[0]), timeout=T(5)) as s:
        s.sendall(b"*3\r\n$7\r\nPUBLISH\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(CHAN), CHAN.encode(), len(message),
                                                                          message))
        s.recv(100)


class Gw:
    """A gateway with its admin listener."""

    def __init__(self, d):
        self.d = d
        self.url = d.url
        self.admin = f"http://{HOST}:{d.ports[1]}"
        self.auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    def replica(self, rid):
        r = requests.get(f"{self.admin}/admin/v1/replicas/{rid}", headers=self.auth, timeout=T(5))
        return r.json() if r.status_code == 200 else None

    def state(self, rid):
        rep = self.replica(rid)
        return rep and rep["state"]

    def drain(self, rid, on=True):
        r = requests.post(f"{self.admin}/admin/v1/replicas/{rid}/{'drain' if on else 'enable'}",
                          headers=self.auth, timeout=T(5))
        assert r.status_code == 200, r.text

    def refused(self, reason=None):
        text = requests.get(f"{self.admin}/metrics", headers=self.auth, timeout=T(5)).text
        m = fleet.parse_prometheus(text)
        vals = {k.split('reason="')[1].rstrip('"}'): v for k, v in m.items()
                if k.startswith("fleetgate_redis_messages_refused_total{")}
        return vals[reason] if reason else vals

    def chat_ok(self):
        r = requests.post(self.url + "/v1/chat/completions", json=fleet.chat_body("hi", model=g.MODEL, max_tokens=3),
                          timeout=T(30))
        assert r.status_code == 200, r.text
        return r.headers["x-fleetgate-replica"]


def start_gateways(gateway, redis, reps, n=2, keys=None, first=0, window_s=30, fleet_section=False,
                   redis_extra=None, env=None, wait=True):
    out = []
    for k in range(first, first + n):
        def config(ports, k=k):
            cfg = g.gw_config(ports[0], reps)
            cfg["admin"] = {"listen": f"{HOST}:{ports[1]}", "token_env": "FG_ADMIN_TOKEN"}
            cfg["redis"] = {"url": f"redis://{HOST}:{redis.ports[0]}/0", "gateway_id": f"gw{k}",
                            "timeout_s": 1, "lease_ttl_s": 3, "message_window_s": window_s,
                            "key_env": f"FG_REDIS_KEY_{k}", **(redis_extra or {})}
            if fleet_section:
                cfg["fleet"] = {"secret_env": "FG_SECRET", "heartbeat_timeout_s": 30}
            return cfg
        key = (keys or {}).get(k, KEY)
        ready = len(reps)
        d = gateway(config, n_ports=2, name=f"gw{k}",
                    ready=(lambda d: (g.replicas_ready(d) or 0) >= ready) if ready else None,
                    env={"FG_ADMIN_TOKEN": ADMIN_TOKEN, f"FG_REDIS_KEY_{k}": key, "FG_SECRET": SECRET,
                         **(env or {})})
        out.append(Gw(d))
    if wait:
        want = str(first + n)
        fleet.wait_until(lambda: rcli(redis, "ZCARD", "fleetgate:gateways") == want, T(10),
                         what="gateways registered in redis")
    return out


def plain_and_forged(rid, claimed):
    """Messages an attacker without the key can write: the old plain form, and envelopes
    with a made-up MAC (zeros, or copied from a real message of another payload)."""
    now = int(time.time() * 1000)
    seq = now * 1000 + 999_999
    return [f"drain {rid} on {claimed}".encode(),
            f"state {rid} down {claimed} forged".encode(),
            f"fg1 {claimed} {seq} {now} {'0' * 64}\ndrain {rid} on {claimed}".encode(),
            f"fg1 {claimed} {seq + 1} {now} {'ab' * 32}\nstate {rid} down {claimed} forged".encode()]


def test_forged_drain_and_state_messages_change_nothing(procs, sim, gateway):
    redis = start_redis(procs)
    phone = g.phone(sim, "p0", slots=2, decode_tps=100)
    a, b = start_gateways(gateway, redis, [g.replica(phone)])
    for claimed in ("gw0", "gw1", "gw7"):
        for m in plain_and_forged("p0", claimed):
            publish(redis, m)
    time.sleep(0.5)
    for gw in (a, b):
        assert gw.state("p0") == "ready", gw.replica("p0")
        assert gw.chat_ok() == "p0"
        counts = gw.refused()
        # 6 plain messages, 6 with a made-up MAC (a gateway's own name is no help either)
        assert counts["format"] == 6 and counts["mac"] == 6, counts
        assert counts["replay"] == 0 and counts["stale"] == 0, counts
        assert "redis: refused" in gw.d.logs(), "refusals are logged"
    # the real thing: an admin's drain on A reaches B, and so does the enable
    a.drain("p0")
    fleet.wait_until(lambda: b.state("p0") == "draining", T(5), what="A's drain on B")
    a.drain("p0", on=False)
    fleet.wait_until(lambda: b.state("p0") == "ready", T(5), what="A's enable on B")
    assert b.chat_ok() == "p0"
    assert b.refused()["mac"] == 6, "the real messages are not refused"


def test_a_replayed_or_stale_message_is_dropped(procs, sim, gateway):
    redis = start_redis(procs)
    phone = g.phone(sim, "p0", slots=2, decode_tps=100)
    a, b = start_gateways(gateway, redis, [g.replica(phone)], window_s=2)
    sub = Subscriber(redis)
    try:
        a.drain("p0")
        fleet.wait_until(lambda: b.state("p0") == "draining", T(5), what="A's drain on B")
        drain_msg = sub.wait_for(b"\ndrain p0 on gw0")
        a.drain("p0", on=False)
        fleet.wait_until(lambda: b.state("p0") == "ready", T(5), what="A's enable on B")
        assert drain_msg.startswith(b"fg1 gw0 "), drain_msg
        # the captured drain, published again at once: a replay
        publish(redis, drain_msg)
        time.sleep(0.5)
        assert b.state("p0") == "ready" and a.state("p0") == "ready"
        assert b.refused("replay") == 1, b.refused()
        assert b.chat_ok() == "p0"
        # to a gateway that never saw it, once it is older than the window: stale
        time.sleep(2.2)
        (c,) = start_gateways(gateway, redis, [g.replica(phone)], n=1, first=2, window_s=2)
        publish(redis, drain_msg)
        time.sleep(0.5)
        assert c.state("p0") == "ready" and b.state("p0") == "ready"
        assert c.refused("stale") == 1, c.refused()
        assert b.refused("replay") == 1 and b.refused("stale") == 1, b.refused()  # time is checked first
        # a fresh drain still goes everywhere
        a.drain("p0")
        for gw in (b, c):
            fleet.wait_until(lambda gw=gw: gw.state("p0") == "draining", T(5), what="a new drain")
    finally:
        sub.close()


def heartbeat(gw, phone, rid, key=None):
    body = {"id": rid, "url": phone.url, "models": [g.MODEL], "slots": 1, "n_ctx": 4096, "state": "ready"}
    raw, h = g.heartbeat_headers(body, secret=SECRET, key=key)
    r = requests.post(gw.url + "/fleet/v1/heartbeat", data=raw, timeout=T(5), headers=h)
    assert r.status_code == 200, r.text
    return h["x-fleetgate-timestamp"], raw


_SEQ = [0]


def seal(context, payload: bytes, sender="gw0"):
    """A stored value sealed as a gateway would (seal.h): what an attacker holding the
    gateways' key, but no phone's key, can write."""
    import hashlib
    import hmac
    now = int(time.time() * 1000)
    _SEQ[0] += 1
    seq = now * 1000 + 500_000 + _SEQ[0]
    mac = hmac.new(KEY.encode(), f"fg1 {context} {sender} {seq} {now}\n".encode() + payload,
                   hashlib.sha256).hexdigest()
    return f"fg1 {sender} {seq} {now} {mac}\n".encode() + payload


def test_a_sealed_heartbeat_without_the_phones_signature_is_refused(procs, sim, gateway):
    """Even with the gateways' Redis key, a stored heartbeat must carry the phone's own
    signatures: relayed heartbeats are verified again against the pins. A planted one with
    a made-up key signature, or one for an enrolled phone signed by another key, is
    refused; a real relayed one is taken (the same path, so the test could fail)."""
    redis = start_redis(procs)
    good = g.phone(sim, "good", slots=1)
    evil = g.phone(sim, "evil", slots=1)
    a, b = start_gateways(gateway, redis, [], n=2, fleet_section=True)
    heartbeat(a, good, "good")
    fleet.wait_until(lambda: b.replica("good") is not None, T(10), what="good relayed to B")
    attacker = g.PhoneKey()
    ts = str(int(time.time() * 1000))

    def planted(rid, url, fleet_sig, key_sig, key_pub):
        body = json.dumps({"id": rid, "url": url, "key": key_pub, "models": [g.MODEL], "slots": 1,
                           "state": "ready"}).encode()
        sigs = (fleet_sig(ts, body) if fleet_sig else "-", key_sig(ts, body))
        return seal(f"fleetgate:hb:{rid}", f"{ts}\n{sigs[0]}\n{sigs[1]}\n".encode() + body)

    # a new id with the fleet secret's HMAC (a leaked secret) but a key signature that does
    # not verify
    import hashlib
    import hmac

    def fleet_hmac(t, bd):
        return "sha256=" + hmac.new(SECRET.encode(), t.encode() + b"." + bd, hashlib.sha256).hexdigest()
    v1 = planted("evil", evil.url, fleet_hmac, lambda t, bd: attacker.sign(t, b"other bytes"), attacker.pub)
    # good's id, its URL moved to evil, signed properly by another key (key mismatch)
    v2 = planted("good", evil.url, None, attacker.sign, attacker.pub)
    rcli(redis, "SET", "fleetgate:hb:evil", v1.decode(), "PX", "300000")
    rcli(redis, "SET", "fleetgate:hb:good", v2.decode(), "PX", "300000")
    rcli(redis, "SADD", "fleetgate:phones", "evil")
    publish(redis, seal("fleetgate:events", b"hb evil", sender="gw7"))
    publish(redis, seal("fleetgate:events", b"hb good", sender="gw7"))
    time.sleep(1.0)
    for gw in (a, b):
        assert gw.replica("evil") is None, gw.replica("evil")
        assert gw.replica("good")["url"] == good.url, gw.replica("good")
    for _ in range(4):
        assert b.chat_ok() == "good"
    assert evil.get("/agent/v1/status").json()["requests"] == 0
    refusals = [r["msg"] for r in g.log_records(b.d) if "relayed heartbeat" in r.get("msg", "")]
    assert any("evil" in m and "key signature" in m for m in refusals), refusals
    # good's id with another key and no fleet secret: a stranger, refused without being
    # told whether the id is enrolled
    assert any("relayed heartbeat of good refused" in m for m in refusals), refusals

def test_forged_or_moved_heartbeat_values_are_ignored(procs, sim, gateway):
    redis = start_redis(procs)
    good = g.phone(sim, "good", slots=1)
    evil = g.phone(sim, "evil", slots=1)  # an attacker's "phone", which would get traffic
    (a,) = start_gateways(gateway, redis, [], n=1, fleet_section=True)
    # the real path: a heartbeat accepted by A is stored sealed
    heartbeat(a, good, "good")
    stored = fleet.wait_until(lambda: (lambda v: v if v.startswith("fg1 gw0 ") else None)(
        rcli(redis, "GET", "fleetgate:hb:good")), T(5), what="good's heartbeat stored sealed")
    # planted: a plain heartbeat for "evil", and good's sealed value copied under evil's key
    ts = str(int(time.time() * 1000))
    plain = ts + "\n" + json.dumps({"id": "evil", "url": evil.url, "models": [g.MODEL], "slots": 1,
                                    "n_ctx": 4096, "state": "ready"})
    rcli(redis, "SET", "fleetgate:hb:evil", plain, "PX", "300000")
    rcli(redis, "SET", "fleetgate:hb:moved", stored, "PX", "300000")
    rcli(redis, "SADD", "fleetgate:phones", "evil", "moved")
    publish(redis, b"hb evil")
    # B starts and loads every phone Redis lists: only the sealed, unmoved one counts
    (b,) = start_gateways(gateway, redis, [], n=1, first=1, fleet_section=True, wait=False)
    fleet.wait_until(lambda: b.replica("good") is not None, T(10), what="good known to B")
    time.sleep(0.5)
    for gw in (a, b):
        assert gw.replica("evil") is None and gw.replica("moved") is None
    assert b.refused("format") >= 1 and b.refused("mac") >= 1, b.refused()
    assert a.refused("format") >= 1, a.refused()  # the plain "hb evil" message
    assert evil.get("/agent/v1/status").json()["requests"] == 0  # never sent a request
    fleet.wait_until(lambda: b.state("good") == "ready", T(10), what="good ready on B")
    assert b.chat_ok() == "good"


def test_forged_learned_speeds_are_ignored(procs, sim, gateway):
    redis = start_redis(procs)
    phone = g.phone(sim, "p0", slots=2, decode_tps=100)
    rep = g.replica(phone)
    (a,) = start_gateways(gateway, redis, [rep], n=1)
    # A learns the phone's speeds from real answers and shares them, sealed
    def shared():
        for _ in range(3):
            a.chat_ok()
        v = rcli(redis, "HGET", "fleetgate:rates", "p0")
        return v if v.startswith("fg1 gw0 ") else None
    real = fleet.wait_until(shared, T(20), interval=1, what="A's learned speeds in redis")
    pre = float(real.split("\n", 1)[1].split()[0])
    # a fresh gateway takes them
    (b,) = start_gateways(gateway, redis, [rep], n=1, first=1, wait=False)
    fleet.wait_until(lambda: abs(b.replica("p0")["prefill_tps"] - pre) < 0.01, T(10), what="B took A's speeds")
    # forged: a plain value
    rcli(redis, "HSET", "fleetgate:rates", "p0", "0.5 0.5")
    (c,) = start_gateways(gateway, redis, [rep], n=1, first=2, wait=False)
    fleet.wait_until(lambda: c.refused("format") >= 1, T(10), what="C refused the plain speeds")
    assert c.replica("p0")["prefill_tps"] == rep["prefill_tps"], c.replica("p0")  # its config's, not 0.5
    assert c.chat_ok() == "p0"


def test_a_gateway_with_another_key_cannot_talk_to_the_others(procs, sim, gateway):
    redis = start_redis(procs)
    phones = [g.phone(sim, f"p{i}", slots=2, decode_tps=100) for i in range(2)]
    reps = [g.replica(p) for p in phones]
    a, b = start_gateways(gateway, redis, reps, keys={1: OTHER_KEY})
    a.drain("p0")
    time.sleep(1.0)
    assert a.state("p0") == "draining"
    assert b.state("p0") == "ready", "a drain under another key was applied"
    assert b.refused("mac") >= 1, b.refused()
    assert "wrong MAC" in b.d.logs()
    b.drain("p1")
    fleet.wait_until(lambda: a.refused("mac") >= 1, T(5), what="A refused B's drain")
    assert a.state("p1") == "ready"
    # both go on serving from their own views
    assert a.chat_ok() == "p1"
    assert b.chat_ok() == "p0"


def test_a_wrong_redis_password_is_degraded_mode_not_an_outage(procs, sim, gateway):
    redis = start_redis(procs, extra=["--requirepass", "the-real-redis-password"])
    phone = g.phone(sim, "p0", slots=2, decode_tps=100)
    reps = [g.replica(phone)]
    (bad,) = start_gateways(gateway, redis, reps, n=1, redis_extra={"password_env": "FG_REDIS_PW"},
                            env={"FG_REDIS_PW": "a-wrong-password"}, wait=False)
    (good,) = start_gateways(gateway, redis, reps, n=1, first=1, redis_extra={"password_env": "FG_REDIS_PW"},
                             env={"FG_REDIS_PW": "the-real-redis-password"}, wait=False)
    fleet.wait_until(lambda: rcli(redis, "ZRANGE", "fleetgate:gateways", 0, -1,
                                  password="the-real-redis-password") == "gw1", T(10),
                     what="the gateway with the right password registered")
    time.sleep(2.0)  # several reconnects with back-off
    for _ in range(3):
        assert bad.chat_ok() == "p0"
        assert good.chat_ok() == "p0"
    logs = bad.d.logs(tail=10 ** 6)
    assert logs.count("redis: AUTH refused") == 1, logs[-3000:]  # said once, not at each retry
    assert "serving from this gateway's own view" in logs
    assert "redis: connected" not in logs
    assert rcli(redis, "ZRANGE", "fleetgate:gateways", 0, -1, password="the-real-redis-password") == "gw1"
    assert "redis: connected" in good.d.logs()
