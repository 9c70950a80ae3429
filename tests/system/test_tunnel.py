"""fleetgate-agent --tunnel acurast behind the real gateway, with acubridge.FakeBridge
playing the Acurast processor's bridge socket and relay (see acubridge.py for how its
URLs are both the protocol's https://<clientId>.<domainSuffix> shape and routable here):
the heartbeat carries the tunnel's URL and requests go through it; a failed tunnel is
reopened, its new URL heartbeated at once and followed by the gateway; FLEETGATE_TUNNEL_KEY
keeps the key (and so the clientId) across restarts; junk from the bridge is refused and
logged; a missing BRIDGE_SOCKET and conflicting options stop the agent at start."""

import base64
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

import fleet
from acubridge import FakeBridge
from fleet import HOST, T

TOKEN = "agent-s3cret-token"
SECRET = "fleet-secret-0123456789abcdef"
CHAT = "/v1/chat/completions"
ENV = {"FLEETGATE_FLEET_SECRET": SECRET, "FLEETGATE_REPLICA_TOKEN": TOKEN}
RELAY = "relay.test.invalid:4433"


@pytest.fixture
def bridge(tmp_path):
    """A scripted Acurast bridge on an abstract Unix socket (acubridge.FakeBridge)."""
    b = FakeBridge(tmp_path)
    yield b
    b.close()


def gw_config(port, ca_file, interval=20.0):
    # a long heartbeat interval: a URL heard within a second or two came from the
    # immediate heartbeat a change sends, not from the regular beat
    return {
        "listen": [{"address": f"{HOST}:{port}"}],
        "fleet": {"secret_env": "FLEETGATE_FLEET_SECRET", "replica_token_env": "FLEETGATE_REPLICA_TOKEN",
                  "heartbeat_timeout_s": 60, "heartbeat_interval_s": interval},
        "health": {"interval_s": 0.5, "timeout_s": 1, "rise": 1, "fall": 2, "readyz_counts": True},
        "upstream": dict(fleet.ALLOW_LOOPBACK, ca_file=ca_file),
        "queue": {"max": 100, "timeout_s": 30},
        "scheduler": {"retries": 2, "default_max_tokens": 64},
        "log_level": "info",
        "replicas": [],
    }


def records(d):
    out = []
    for line in Path(d.stderr_path).read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def readyz(g):
    try:
        return requests.get(g.url + "/readyz", timeout=1).json().get("replicas_ready") or 0
    except (requests.RequestException, ValueError):
        return 0


def gateway_urls(g, id):
    """The URLs the gateway took for replica id from heartbeats, in order."""
    urls = []
    for r in records(g):
        if r.get("msg") == "replica registered by heartbeat" and r.get("replica") == id:
            urls.append(r["url"])
        m = str(r.get("msg", ""))
        if m.startswith(f"replica {id} now at "):
            urls.append(m[len(f"replica {id} now at "):])
    return urls


def start_phone(procs, bridge, gateway_url, id="phone-t", key=None, name="phone"):
    env = dict(ENV, BRIDGE_SOCKET=bridge.name, FLEETGATE_TUNNEL_KEY=key or "")
    return procs.spawn(name, lambda ports: fleet.sim_argv(
        ports[0], slots=2, prefill_tps=500, decode_tps=50, time_scale=10, id=id,
        extra_args=("--gateway", gateway_url, "--tunnel", "acurast", "--tunnel-relay", RELAY,
                    "--tunnel-domain", "localhost")), env=env)


def p256_key_b64():
    k = ec.generate_private_key(ec.SECP256R1())
    der = k.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption())
    return base64.b64encode(der).decode()


def chat_ok(g, what):
    r = requests.post(g.url + CHAT, json=fleet.chat_body(what, max_tokens=3), timeout=T(15))
    assert r.status_code == 200, r.text
    assert r.headers.get("x-fleetgate-replica") == "phone-t", r.headers
    return r


def test_heartbeat_carries_the_tunnel_url_and_follows_a_reopened_tunnel(procs, gateway, bridge):
    g = gateway(lambda ports: gw_config(ports[0], bridge.ca_file), env=ENV)
    d = start_phone(procs, bridge, g.url)
    assert fleet.wait_until(lambda: readyz(g) >= 1, T(10)), (g.logs(), d.logs())
    # the spec the agent sent: the reference's fields, its own listener as localAddr
    spec = bridge.starts()[0][0]
    assert spec["serverAddrs"] == [RELAY]
    assert spec["domainSuffix"] == "localhost"
    assert spec["localAddr"] == f"{HOST}:{d.port}"
    assert spec["primaryKey"]["algorithm"] == "Secp256r1"
    key = serialization.load_der_private_key(base64.b64decode(spec["primaryKey"]["bytes"]), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    url_a = bridge.urls[0]
    assert url_a.startswith("https://") and ".localhost:" in url_a
    assert gateway_urls(g, "phone-t") == [url_a], g.logs()
    relay_a = bridge.relays[0]
    chat_ok(g, "through tunnel A")
    # the gateway knows the phone only by url A: the request went through the relay
    assert relay_a.served >= 1
    # polled: the agent asks tunnel_status every few seconds
    assert fleet.wait_until(lambda: bridge.methods().count("tunnel_status") >= 1, T(8)), bridge.calls

    served_a = relay_a.served
    bridge.fail()  # status 3 from now on, and tunnel A no longer forwards
    assert fleet.wait_until(lambda: len(bridge.urls) >= 2, T(12)), (bridge.calls, d.logs())
    url_b = bridge.urls[1]
    assert url_b != url_a
    t_b = time.monotonic()
    assert fleet.wait_until(lambda: url_b in gateway_urls(g, "phone-t"), T(10)), g.logs()
    # at once: well before the next regular heartbeat (every 20 s), and at a pace the
    # gateway takes (no 429 heartbeat_rate)
    assert time.monotonic() - t_b < T(3.5), (time.monotonic() - t_b, d.logs())
    relay_b = bridge.relays[0]
    assert fleet.wait_until(lambda: readyz(g) >= 1, T(10)), g.logs()
    chat_ok(g, "through tunnel B")
    assert relay_b.served >= 1
    assert relay_a.served == served_a  # nothing went to the dead tunnel
    agent_logs = [r for r in records(d) if r.get("msg") == "tunnel open"]
    assert [r["url"] for r in agent_logs] == [url_a, url_b], agent_logs
    assert any("the tunnel is failed" in str(r.get("msg")) for r in records(d)), d.logs()
    assert not any("heartbeat_rate" in str(r.get("msg")) for r in records(d)), d.logs()


def test_tunnel_key_keeps_the_primary_key_across_restarts(procs, bridge):
    gw = "http://127.0.0.1:9"  # no gateway: only the bridge is watched here
    key = p256_key_b64()
    for i in range(2):
        d = start_phone(procs, bridge, gw, key=key, name=f"kept-{i}")
        assert fleet.wait_until(lambda n=i + 1: len(bridge.starts()) >= n, T(10)), d.logs()
        d.stop()
    for i in range(2):
        d = start_phone(procs, bridge, gw, name=f"fresh-{i}")
        assert fleet.wait_until(lambda n=i + 3: len(bridge.starts()) >= n, T(10)), d.logs()
        d.stop()
    keys = [s[0]["primaryKey"]["bytes"] for s in bridge.starts()]
    assert keys[0] == keys[1] == key
    assert len({keys[1], keys[2], keys[3]}) == 3  # without the variable: a new key each run
    assert bridge.urls[0].split(":")[1] == bridge.urls[1].split(":")[1]  # same clientId host


def test_junk_from_the_bridge_is_refused_and_logged(procs, gateway, bridge):
    bridge.script = [
        {"result": {"url": "http://plain.localhost:1", "clientId": "plain"}},
        {"result": {"url": "https://evil.example.com", "clientId": "evil"}},
        "this is not JSON\n",
    ]
    g = gateway(lambda ports: gw_config(ports[0], bridge.ca_file), env=ENV)
    d = start_phone(procs, bridge, g.url)
    # back-off 1, 2, 4 s (±25 %) before the good answer
    assert fleet.wait_until(lambda: readyz(g) >= 1, T(20)), (g.logs(), d.logs())
    msgs = [str(r.get("msg")) for r in records(d)]
    refused = [m for m in msgs if "tunnel_start answer refused" in m]
    assert len(refused) == 3, msgs
    assert "not https" in refused[0] and "not under the tunnel's domain" in refused[1] \
        and "not a JSON object" in refused[2], refused
    assert gateway_urls(g, "phone-t") == [bridge.urls[0]]
    text = Path(g.stderr_path).read_text()
    assert "evil.example.com" not in text and "plain.localhost" not in text
    # a status out of the protocol's range is refused, and three in a row reopen
    bridge.status = 7
    assert fleet.wait_until(lambda: len(bridge.starts()) >= 5, T(20)), d.logs()
    msgs = [str(r.get("msg")) for r in records(d)]
    assert sum("tunnel_status answer refused" in m for m in msgs) >= 3, msgs
    assert any("its status cannot be read" in m for m in msgs), msgs
    # the reopened tunnel's URL comes with the next heartbeat; the health checks of the
    # old one may have sent the phone down for a cool-down first (longer after each
    # ejection): the request waits for it, so wait for it to be ready (on a loaded
    # machine that took longer than chat_ok's 15 s)
    assert fleet.wait_until(lambda: readyz(g) >= 1, T(30)), (g.logs(), d.logs())
    chat_ok(g, "still served")


def test_an_oversize_answer_is_cut_off_and_a_trickled_one_read_whole(procs, bridge):
    """The agent stops reading an answer at 64 KiB; an answer that arrives one byte at a
    time is put together."""
    bridge.script = ["{" + "x" * 70000 + "\n"]
    bridge.trickle = True
    d = start_phone(procs, bridge, "http://127.0.0.1:9")
    assert fleet.wait_until(lambda: any(r.get("msg") == "tunnel open" for r in records(d)), T(15)), d.logs()
    msgs = [str(r.get("msg")) for r in records(d)]
    refused = [m for m in msgs if "tunnel_start answer refused" in m]
    assert len(refused) == 1 and "too large" in refused[0], msgs
    opened = [r for r in records(d) if r.get("msg") == "tunnel open"]
    assert opened[0]["url"] == bridge.urls[0]


def run_agent(args, env):
    e = {k: v for k, v in os.environ.items() if k not in ("BRIDGE_SOCKET", "FLEETGATE_TUNNEL_KEY")}
    e.update(ENV)
    e.update(env)
    return subprocess.run([fleet.agent_bin(), "--engine", "sim", "--listen", f"{HOST}:0", "--model", "m",
                           *args], env=e, capture_output=True, text=True, timeout=T(10))


def test_bad_tunnel_settings_stop_the_agent_at_start(bridge):
    base = ["--gateway", "http://127.0.0.1:9", "--tunnel", "acurast"]
    p = run_agent(base, {})
    assert p.returncode == 1 and "BRIDGE_SOCKET is not set" in p.stderr, p.stderr
    p = run_agent(base + ["--public-url", "https://x.example"], {"BRIDGE_SOCKET": bridge.name})
    assert p.returncode == 1 and "--tunnel and --public-url" in p.stderr, p.stderr
    p = run_agent(["--tunnel", "acurast"], {"BRIDGE_SOCKET": bridge.name})
    assert p.returncode == 1 and "--tunnel needs --gateway" in p.stderr, p.stderr
    p = run_agent(base, {"BRIDGE_SOCKET": bridge.name, "FLEETGATE_TUNNEL_KEY": "bm90IGEga2V5"})
    assert p.returncode == 1 and "FLEETGATE_TUNNEL_KEY: not base64" in p.stderr, p.stderr
    ed = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    p = run_agent(base, {"BRIDGE_SOCKET": bridge.name, "FLEETGATE_TUNNEL_KEY": base64.b64encode(ed).decode()})
    assert p.returncode == 1 and "not a P-256" in p.stderr, p.stderr
    p = run_agent(base + ["--tunnel", "ngrok"], {"BRIDGE_SOCKET": bridge.name})
    assert p.returncode == 1 and "only kind is acurast" in p.stderr, p.stderr
    p = run_agent(base + ["--tunnel-relay", "no-port"], {"BRIDGE_SOCKET": bridge.name})
    assert p.returncode == 1 and "--tunnel-relay" in p.stderr, p.stderr
    p = run_agent(["--gateway", "http://127.0.0.1:9", "--public-url", "http://127.0.0.1:1",
                   "--tunnel-domain", "acu.run"], {})
    assert p.returncode == 1 and "need --tunnel" in p.stderr, p.stderr
    assert bridge.calls == []


def test_a_bridge_nobody_listens_on_is_retried(procs):
    name = f"fleetgate-test-nobody-{os.getpid()}"
    d = procs.spawn("phone", lambda ports: fleet.sim_argv(
        ports[0], id="phone-n", extra_args=("--gateway", "http://127.0.0.1:9", "--tunnel", "acurast")),
        env=dict(ENV, BRIDGE_SOCKET=name, FLEETGATE_TUNNEL_KEY=""))
    assert fleet.wait_until(lambda: sum("tunnel_start failed" in str(r.get("msg")) for r in records(d)) >= 2,
                            T(10)), d.logs()
    assert d.alive()
