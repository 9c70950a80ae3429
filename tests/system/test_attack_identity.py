"""Attacks on the fleet's registry by someone who holds the fleet secret (a rooted phone,
a leaked deployment) or nothing at all, against the real gateway and agents
(docs/security.md, "Phones' identities"). Each attack must fail, and each test also shows
the legitimate path working, so that it could fail."""

import hashlib
import hmac
import socket
import threading
import time

import pytest
import requests

import fleet
import gwutil as g
from fleet import HOST, T

SECRET = "fleet-secret-0123456789abcdef"
HB = "/fleet/v1/heartbeat"


class Listener:
    """A TCP listener that counts connections (an attacker's URL: nothing may reach it)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind((HOST, 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{HOST}:{self.port}"
        self.accepted = 0
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            c.close()

    def close(self):
        self.stop = True
        self.thread.join(2)
        self.sock.close()


@pytest.fixture
def listener():
    lst = Listener()
    yield lst
    lst.close()


def fleet_gw(gateway, replicas=(), ports_extra=0, **fleet_over):
    fl = {"secret_env": "FG_SECRET", "heartbeat_timeout_s": 30, "heartbeat_interval_s": 0.2}
    fl.update(fleet_over)
    return gateway(lambda ports: dict(g.gw_config(ports[0], list(replicas)), fleet=fl),
                   env={"FG_SECRET": SECRET})


def beat(gw, body, **kw):
    raw, h = g.heartbeat_headers(body, **kw)
    return requests.post(gw.url + HB, data=raw, headers=h, timeout=T(5))


def body_of(id, url, **over):
    b = {"id": id, "url": url, "models": [g.MODEL], "slots": 1, "state": "ready"}
    b.update(over)
    return b


def served_by(gw, n=4, max_tokens=8):
    """The replicas that answered n requests sent at once."""
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        rs = list(ex.map(lambda _: g.chat(gw, max_tokens=max_tokens, timeout=T(20)), range(n)))
    assert all(r.status_code == 200 for r in rs), [r.text for r in rs if r.status_code != 200]
    return {r.headers.get("x-fleetgate-replica") for r in rs}


def test_forged_heartbeats_are_refused(sim, gateway):
    """Without the fleet secret, without the phone's key signature, or with a signature
    by another key, nothing registers; the real thing does."""
    phone = g.phone(sim, "p1")
    gw = fleet_gw(gateway)
    b = body_of("p1", phone.url)
    other = g.PhoneKey()
    cases = [
        ("wrong fleet secret", dict(secret="not-the-fleet-secret-at-all"), 401, "invalid_signature"),
        ("no fleet secret on enrolment", dict(), 401, "missing_signature"),
        ("signed by another key", dict(secret=SECRET, key_sig=other.sign("1", b"x")), 401,
         "invalid_signature"),
        ("key signature of other bytes", dict(secret=SECRET,
                                              key_sig=g.phone_key("p1").sign("1", b"{}")), 401,
         "invalid_signature"),
    ]
    for what, kw, status, code in cases:
        r = beat(gw, b, **kw)
        assert r.status_code == status and r.json()["error"]["code"] == code, (what, r.text)
    # no key signature header at all
    raw, h = g.heartbeat_headers(b, secret=SECRET)
    del h["x-fleetgate-key-signature"]
    r = requests.post(gw.url + HB, data=raw, headers=h, timeout=T(5))
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_signature", r.text
    # a key that is not one
    r = beat(gw, dict(b, key="bm90IGEga2V5"), secret=SECRET)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_heartbeat", r.text
    assert (g.replicas_ready(gw) or 0) == 0
    # the real thing
    r = beat(gw, b, secret=SECRET)
    assert r.status_code == 200, r.text
    assert served_by(gw) == {"p1"}


def test_a_replayed_heartbeat_is_refused(sim, gateway):
    """A captured heartbeat sent again (as is, or after newer ones) is refused: timestamps
    grow per id; the phone's next real one is taken."""
    phone = g.phone(sim, "rp")
    gw = fleet_gw(gateway)
    raw, h = g.heartbeat_headers(body_of("rp", phone.url), secret=SECRET)
    assert requests.post(gw.url + HB, data=raw, headers=h, timeout=T(5)).status_code == 200
    r = requests.post(gw.url + HB, data=raw, headers=h, timeout=T(5))
    assert r.status_code == 401 and r.json()["error"]["code"] == "replayed_heartbeat", r.text
    time.sleep(0.3)
    assert beat(gw, body_of("rp", phone.url)).status_code == 200
    r = requests.post(gw.url + HB, data=raw, headers=h, timeout=T(5))
    assert r.status_code == 401 and r.json()["error"]["code"] == "replayed_heartbeat", r.text
    # the captured bytes with another timestamp: the signatures no longer match
    h2 = dict(h, **{"x-fleetgate-timestamp": str(int(time.time() * 1000))})
    r = requests.post(gw.url + HB, data=raw, headers=h2, timeout=T(5))
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_signature", r.text


def test_a_leaked_fleet_secret_cannot_take_over_an_enrolled_phone(sim, gateway, listener):
    """The attacker holds the fleet secret: a heartbeat for the victim's id with its own
    key and URL, timestamped at the edge of the skew window, is refused; the victim's
    traffic never reaches the attacker, and the victim's next heartbeats are not taken
    for replays."""
    victim = g.phone(sim, "victim")
    gw = fleet_gw(gateway)
    vb = body_of("victim", victim.url)
    assert beat(gw, vb, secret=SECRET).status_code == 200
    attacker = g.PhoneKey()
    future = int(time.time() * 1000) + 25_000
    for ts in (None, future):
        r = beat(gw, body_of("victim", listener.url), secret=SECRET, key=attacker, ts=ts)
        assert r.status_code == 401 and r.json()["error"]["code"] == "key_mismatch", r.text
    assert served_by(gw, 6) == {"victim"}
    time.sleep(0.3)
    r = beat(gw, vb, secret=SECRET)  # now, well before the attacker's timestamp
    assert r.status_code == 200, r.text
    # and even without the fleet secret: an enrolled phone needs only its key
    time.sleep(0.3)
    assert beat(gw, vb).status_code == 200
    assert listener.accepted == 0
    assert g.log_msgs(gw, "heartbeat refused")


def test_an_enrolled_phone_moves_url_with_its_own_key(sim, gateway):
    """Tunnels change: a URL change signed by the phone's key is taken."""
    a = g.phone(sim, "mover")
    b = g.phone(sim, "mover-new-home")
    gw = fleet_gw(gateway)
    assert beat(gw, body_of("mover", a.url), secret=SECRET).status_code == 200
    assert g.chat(gw).status_code == 200
    time.sleep(0.3)
    assert beat(gw, body_of("mover", b.url)).status_code == 200
    old_before, new_before = len(g.log_msgs(a, "request")), len(g.log_msgs(b, "request"))
    for _ in range(3):
        r = g.chat(gw)
        assert r.status_code == 200 and r.headers["x-fleetgate-replica"] == "mover"
    # the requests went to the new URL: the old phone saw none of them
    fleet.wait_until(lambda: len(g.log_msgs(b, "request")) == new_before + 3, T(5), what="new URL served")
    assert len(g.log_msgs(a, "request")) == old_before
    assert any("moved from" in x.get("msg", "") for x in g.log_records(gw))


def test_ids_from_files_are_not_taken_by_heartbeats(sim, gateway, listener):
    """A replica the configuration defines is not the heartbeats' unless its file says
    so; with a pinned key only that key speaks for it."""
    filed = g.phone(sim, "filed", decode_tps=2)
    pinned = g.phone(sim, "pinned", decode_tps=2)
    owner = g.PhoneKey()
    gw = fleet_gw(gateway, replicas=[g.replica(filed), dict(g.replica(pinned), key=owner.pub)])
    attacker = g.PhoneKey()
    r = beat(gw, body_of("filed", listener.url), secret=SECRET, key=attacker)
    assert r.status_code == 403 and r.json()["error"]["code"] == "id_reserved", r.text
    r = beat(gw, body_of("pinned", listener.url), secret=SECRET, key=attacker)
    assert r.status_code == 401 and r.json()["error"]["code"] == "key_mismatch", r.text
    # the file's own phone, signing with the pinned key and no fleet secret at all
    r = beat(gw, body_of("pinned", pinned.url, device={"battery_pct": 50}), key=owner)
    assert r.status_code == 200, r.text
    assert served_by(gw, 2, max_tokens=4) == {"filed", "pinned"}
    # the file's settings still win: the heartbeat's URL does not move a file replica
    time.sleep(0.3)
    assert beat(gw, body_of("pinned", listener.url), key=owner).status_code == 200
    assert served_by(gw, 2, max_tokens=4) == {"filed", "pinned"}
    assert listener.accepted == 0


def test_registry_flood_is_capped(sim, gateway, listener):
    """100 forged ids with the fleet secret: at most fleet.max_replicas are enrolled, and
    no faster than fleet.max_enrolments_per_min; a known phone is still served."""
    phone = g.phone(sim, "real")
    gw = fleet_gw(gateway, max_replicas=6, max_enrolments_per_min=1000)
    assert beat(gw, body_of("real", phone.url), secret=SECRET).status_code == 200
    codes = [beat(gw, body_of(f"forged-{i}", listener.url), secret=SECRET).status_code
             for i in range(40)]
    assert codes.count(200) == 5 and codes.count(503) == 35, codes
    r = beat(gw, body_of("forged-99", listener.url), secret=SECRET)
    assert r.json()["error"]["code"] == "registry_full", r.text
    gw2 = fleet_gw(gateway, max_enrolments_per_min=3)
    codes = [beat(gw2, body_of(f"burst-{i}", listener.url), secret=SECRET).status_code for i in range(8)]
    assert codes[:3] == [200] * 3 and set(codes[3:]) == {429}, codes
    assert g.chat(gw).status_code == 200


def test_heartbeats_faster_than_asked_are_refused(sim, gateway):
    phone = g.phone(sim, "eager")
    gw = fleet_gw(gateway, heartbeat_interval_s=5)
    b = body_of("eager", phone.url)
    assert beat(gw, b, secret=SECRET).status_code == 200
    r = beat(gw, b)
    assert r.status_code == 429 and r.json()["error"]["code"] == "heartbeat_rate", r.text
    time.sleep(1.1)
    assert beat(gw, b).status_code == 200


def test_approve_mode_waits_for_an_operator(sim, gateway):
    """fleet.enrol "approve": a new phone waits (202) and gets no traffic until an admin
    approves its key; releasing the pin lets the id enrol again with another key."""
    phone = g.phone(sim, "newbie")
    admin_token = "admin-token-0123456789"
    fl = {"secret_env": "FG_SECRET", "heartbeat_timeout_s": 30, "heartbeat_interval_s": 0.2,
          "enrol": "approve"}
    gw = gateway(lambda ports: dict(g.gw_config(ports[0], []), fleet=fl,
                                    admin={"listen": f"{HOST}:{ports[1]}", "token": admin_token}),
                 n_ports=2, env={"FG_SECRET": SECRET})
    admin = f"http://{HOST}:{gw.ports[1]}"
    ah = {"Authorization": f"Bearer {admin_token}"}
    b = body_of("newbie", phone.url)
    r = beat(gw, b, secret=SECRET)
    assert r.status_code == 202 and r.json()["enrolment"] == "pending", r.text
    g.check_error(g.chat(gw), 404, "model_not_found")
    lst = requests.get(admin + "/admin/v1/enrolments", headers=ah, timeout=T(5)).json()
    assert lst["pending"] == 1 and lst["enrolments"][0]["key"] == g.phone_key("newbie").pub, lst
    # approving needs the token
    assert requests.post(admin + "/admin/v1/enrolments/newbie/approve", timeout=T(5)).status_code == 401
    r = requests.post(admin + "/admin/v1/enrolments/newbie/approve", headers=ah, timeout=T(5))
    assert r.status_code == 200 and r.json()["state"] == "pinned", r.text
    time.sleep(0.3)
    assert beat(gw, b).status_code == 200
    assert served_by(gw) == {"newbie"}
    # someone with the fleet secret and another key tries the id: refused, and listed
    # for the operator (the status page's "Refused registrations")
    r = beat(gw, b, secret=SECRET, key=g.PhoneKey())
    assert r.status_code == 401 and r.json()["error"]["code"] == "key_mismatch", r.text
    st = requests.get(admin + "/admin/v1/status", headers=ah, timeout=T(5)).json()
    assert [x["id"] for x in st["refused_registrations"]] == ["newbie"], st["refused_registrations"]
    assert st["refused_registrations"][0]["reason"].startswith("key_mismatch"), st["refused_registrations"]
    assert st["enrolments"] == {"pinned": 1, "pending": 0, "mode": "approve"}, st["enrolments"]
    # released: its replica leaves, and a new key may enrol (and wait) for the id
    r = requests.delete(admin + "/admin/v1/enrolments/newbie", headers=ah, timeout=T(5))
    assert r.status_code == 200 and r.json()["state"] == "released", r.text
    r = beat(gw, b, secret=SECRET, key=g.PhoneKey())
    assert r.status_code == 202, r.text


def test_pins_survive_a_restart(sim, gateway, tmp_path):
    """With fleet.pins_file a restarted gateway still knows whose key owns an id."""
    phone = g.phone(sim, "kept")
    pins = tmp_path / "pins.sqlite"
    gw = fleet_gw(gateway, pins_file=str(pins))
    assert beat(gw, body_of("kept", phone.url), secret=SECRET).status_code == 200
    gw.stop()
    gw2 = fleet_gw(gateway, pins_file=str(pins))
    r = beat(gw2, body_of("kept", phone.url), secret=SECRET, key=g.PhoneKey())
    assert r.status_code == 401 and r.json()["error"]["code"] == "key_mismatch", r.text
    assert beat(gw2, body_of("kept", phone.url)).status_code == 200
    assert served_by(gw2) == {"kept"}


def test_secret_files_are_private_whatever_the_umask(sim, gateway, tmp_path):
    """Under umask 022 (outside the systemd unit's UMask=0077) the pins file, which holds
    the secret every phone's token derives from, batch.db (callers' prompts), the files
    uploaded beside it and the admin drains are all 0600, with SQLite's -wal and -shm
    files; files an older gateway left open to others are tightened at the next start,
    and the log says so. The gateway works with them all along."""
    import os  # noqa: PLC0415
    import stat  # noqa: PLC0415
    from test_admin import TOKEN, TOKEN_ENV, Admin, admin_config  # noqa: PLC0415
    data = tmp_path / "data"
    data.mkdir()
    pins = data / "pins.sqlite"
    phone = g.phone(sim, "kept")
    fl = {"secret_env": "FG_SECRET", "heartbeat_timeout_s": 30, "heartbeat_interval_s": 0.2,
          "pins_file": str(pins)}

    def run():
        return gateway(lambda ports: dict(admin_config(ports, []), fleet=fl, data_dir=str(data)), n_ports=2,
                       env={TOKEN_ENV: TOKEN, "FG_SECRET": SECRET},
                       prefix=("sh", "-c", 'umask 022 && exec "$0" "$@"'))

    def mode(p):
        return stat.S_IMODE(os.stat(p).st_mode)

    gw = run()
    assert beat(gw, body_of("kept", phone.url), secret=SECRET).status_code == 200
    assert served_by(gw, n=1) == {"kept"}
    assert Admin(gw).post("/admin/v1/replicas/kept/drain").status_code == 200
    r = gw.post("/v1/files", files={"file": ("in.jsonl", b'{"custom_id":"a"}\n', "application/jsonl")},
                data={"purpose": "batch"})
    assert r.status_code == 200, r.text
    kept = [pins, data / "batch.db", data / "drains.json", data / "files" / r.json()["id"]]
    for p in kept + [pins.with_name("pins.sqlite-wal"), pins.with_name("pins.sqlite-shm"),
                     data / "batch.db-wal", data / "batch.db-shm"]:
        assert p.exists(), p
        assert mode(p) == 0o600, f"{p} is {mode(p):04o} under umask 022"
    gw.stop()

    for p in kept[:3]:
        os.chmod(p, 0o644)
    gw = run()
    for p in kept[:3]:
        assert mode(p) == 0o600, f"{p} left {mode(p):04o}"
    logs = gw.logs()
    for p in kept[:3]:
        assert f"{p} (was 0644)" in logs or f"{p} could be read by others (mode 0644)" in logs, logs
    r = beat(gw, body_of("kept", phone.url), secret=SECRET, key=g.PhoneKey())
    assert r.status_code == 401 and r.json()["error"]["code"] == "key_mismatch", r.text


TOKEN_KEY = "gateway-only-token-key-0123456789"


def test_each_phone_has_its_own_token(procs, gateway):
    """Two real agents (sims) join by heartbeat: the gateway calls each with a token of
    its own, derived from a secret only the gateway holds, which the agent then requires
    (its configured token no longer opens it); one phone's token does not open another,
    and neither the fleet secret's derivation nor no token opens either."""
    fl = {"secret_env": "FG_SECRET", "heartbeat_timeout_s": 30, "heartbeat_interval_s": 0.2,
          "replica_token_env": "FG_TOKEN_KEY"}
    gw = gateway(lambda ports: dict(g.gw_config(ports[0], []), fleet=fl),
                 env={"FG_SECRET": SECRET, "FG_TOKEN_KEY": TOKEN_KEY})
    shared = "shared-deployment-token-0123456789"
    phones = []
    for name in ("tok-a", "tok-b"):
        def argv(ports, name=name):
            return fleet.sim_argv(ports[0], id=name, decode_tps=20,
                                  extra_args=("--gateway", gw.url, "--public-url", f"http://{HOST}:{ports[0]}"))
        phones.append(procs.spawn(name, argv, env={"FLEETGATE_FLEET_SECRET": SECRET,
                                                   "FLEETGATE_REPLICA_TOKEN": shared}))
    fleet.wait_until(lambda: (g.replicas_ready(gw) or 0) == 2, T(10), what="both phones joined")
    assert served_by(gw, 2, max_tokens=10) == {"tok-a", "tok-b"}
    # the token of each is HMAC(token key, "replica-token." id "\n" key): the test, holding
    # the gateway's key, derives them from the keys the agents logged; a phone holding only
    # the fleet secret cannot
    tokens, from_fleet_secret = {}, {}
    for d in phones:
        key = next(r["key"] for r in g.log_records(d) if r.get("msg") == "listening")
        msg = f"replica-token.{d.name}\n{key}".encode()
        tokens[d.name] = "fgr-" + hmac.new(TOKEN_KEY.encode(), msg, hashlib.sha256).hexdigest()
        from_fleet_secret[d.name] = "fgr-" + hmac.new(SECRET.encode(), msg, hashlib.sha256).hexdigest()
    a, b = phones
    ok = requests.post(a.url + g.CHAT, json=fleet.chat_body("hi"), timeout=T(5),
                       headers={"Authorization": f"Bearer {tokens['tok-a']}"})
    assert ok.status_code == 200, ok.text
    for d, tok in ((b, tokens["tok-a"]), (a, tokens["tok-b"]), (a, None), (b, "fgr-" + "0" * 64),
                   (a, shared), (b, shared), (a, from_fleet_secret["tok-a"])):
        h = {"Authorization": f"Bearer {tok}"} if tok else {}
        r = requests.post(d.url + g.CHAT, json=fleet.chat_body("hi"), timeout=T(5), headers=h)
        assert r.status_code == 401, (d.name, tok, r.text)


def test_infinite_device_figures_are_ignored(sim, gateway):
    """A phone's battery and temperature reach operators and metrics: 1e999 (infinity once
    parsed) and absurd values are ignored, plausible ones taken."""
    phone = g.phone(sim, "hot")
    admin_token = "admin-token-0123456789"
    fl = {"secret_env": "FG_SECRET", "heartbeat_timeout_s": 30, "heartbeat_interval_s": 0.2}
    gw = gateway(lambda ports: dict(g.gw_config(ports[0], []), fleet=fl,
                                    admin={"listen": f"{HOST}:{ports[1]}", "token": admin_token}),
                 n_ports=2, env={"FG_SECRET": SECRET})
    admin = f"http://{HOST}:{gw.ports[1]}"
    ah = {"Authorization": f"Bearer {admin_token}"}
    key = g.phone_key("hot")

    def raw_beat(device_json):
        body = ('{"id": "hot", "url": "%s", "key": "%s", "models": ["%s"], "slots": 1, "state": "ready", '
                '"device": %s}' % (phone.url, key.pub, g.MODEL, device_json)).encode()
        ts = str(int(time.time() * 1000))
        h = {"x-fleetgate-timestamp": ts, "Content-Type": "application/json",
             "x-fleetgate-key-signature": key.sign(ts, body),
             "x-fleetgate-signature": "sha256=" + hmac.new(SECRET.encode(), ts.encode() + b"." + body,
                                                           hashlib.sha256).hexdigest()}
        return requests.post(gw.url + HB, data=body, headers=h, timeout=T(5))

    assert raw_beat('{"battery_pct": 55, "temperature_c": 38.5}').status_code == 200
    time.sleep(0.3)
    r = raw_beat('{"battery_pct": 1e999, "temperature_c": -1e999, "mem_free_mb": 1e999}')
    assert r.status_code == 200, r.text
    rep = requests.get(admin + "/admin/v1/replicas/hot", headers=ah, timeout=T(5)).json()
    assert rep["battery_pct"] == 55 and rep["temperature_c"] == 38.5, rep
    metrics = requests.get(admin + "/metrics", headers=ah, timeout=T(5)).text
    device = [line for line in metrics.splitlines() if 'replica="hot"' in line and
              ("battery" in line or "temperature" in line or "mem_free" in line)]
    assert device, metrics[-2000:]
    for line in device:
        float(line.rsplit(" ", 1)[1])  # a number
        assert line.rsplit(" ", 1)[1].lower() not in ("inf", "+inf", "-inf", "nan"), line
