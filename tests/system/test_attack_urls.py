"""The URL policy against the real binaries (docs/security.md, "URL policy"): someone
holding the fleet secret tries to make the gateway send prompts and replica tokens where
no phone is: an internal service behind a query string, loopback, a name that resolves
to loopback, a private address, the gateway's own admin port. Listeners in the test
count every connection they get: where the policy refuses, the count stays 0 (probes
included) and the replica shows down with the reason; with the range allowed, the same
phone serves, so the checks could fail."""
import concurrent.futures
import socket
import subprocess
import threading
import time

import requests

import fleet
import gwutil as g
from fleet import HOST, T

SECRET = "attack-test-fleet-secret-0123"
ADMIN_TOKEN = "attack-test-admin-token-0123"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


class CountingListener:
    """A TCP port on 127.0.0.1 (and ::1 when it can) that accepts, counts and closes
    every connection: what a phone, or an internal service, would see."""

    def __init__(self):
        self.count = 0
        self.socks = []
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((HOST, 0))
        self.port = s.getsockname()[1]
        self.socks.append(s)
        try:
            s6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            s6.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s6.bind(("::1", self.port))
            self.socks.append(s6)
        except OSError:
            pass
        for sock in self.socks:
            sock.listen(64)
            sock.settimeout(0.2)
            threading.Thread(target=self._accept, args=(sock,), daemon=True).start()
        self.stopped = False

    def _accept(self, sock):
        while not getattr(self, "stopped", False):
            try:
                c, _ = sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.count += 1
            c.close()

    def close(self):
        self.stopped = True
        for s in self.socks:
            s.close()


def heartbeat(gw, body, secret=SECRET):
    """A heartbeat signed by the id's own phone key (gwutil) and, with secret, the fleet's."""
    raw, h = g.heartbeat_headers(body, secret=secret)
    return requests.post(gw.url + "/fleet/v1/heartbeat", data=raw, timeout=T(5), headers=h)


def hb_body(id, url):
    return {"id": id, "url": url, "models": [g.MODEL], "slots": 1, "state": "ready"}


def start(gateway, replicas=(), upstream=None, n_ports=2, health=None):
    """A gateway with heartbeats on, its admin API on ports[1], phones in `replicas`;
    `upstream` replaces the tests' loopback allowance (fleet.ALLOW_LOOPBACK)."""
    def cfg(ports):
        c = g.gw_config(ports[0], list(replicas), health=dict({"interval_s": 0.3}, **(health or {})))
        c["upstream"] = dict({k: v for k, v in c["upstream"].items()
                              if k not in ("allow_http", "allow_addresses")}, **(upstream or {}))
        c["fleet"] = {"secret_env": "FG_ATTACK_SECRET", "heartbeat_timeout_s": 30}
        c["admin"] = {"listen": f"{HOST}:{ports[1]}", "token": ADMIN_TOKEN}
        return c
    gw = gateway(cfg, n_ports=n_ports, env={"FG_ATTACK_SECRET": SECRET})
    gw.admin_url = f"http://{HOST}:{gw.ports[1]}"
    return gw


def admin(gw, path):
    r = requests.get(gw.admin_url + path, headers=ADMIN, timeout=T(5))
    assert r.status_code == 200, r.text
    return r.json()


def replicas(gw):
    return {r["id"]: r for r in admin(gw, "/admin/v1/replicas")["replicas"]}


def metrics(gw):
    r = requests.get(gw.admin_url + "/metrics", headers=ADMIN, timeout=T(5))
    assert r.status_code == 200, r.text
    return fleet.parse_prometheus(r.text)


def wait_down(gw, rid, words):
    def down():
        r = replicas(gw).get(rid)
        return r if r and r["state"] == "down" and words in r["reason"] else None
    got = fleet.wait_until(down, T(6), what=f"{rid} down with {words!r}")
    assert got, (replicas(gw).get(rid), gw.logs())
    return got


def test_heartbeat_urls_with_query_fragment_userinfo_are_refused(gateway):
    """The issue's URL and its relatives: each signed heartbeat is 400 url_not_allowed,
    nothing is registered, the target never hears from the gateway, and the admin API,
    the metric and the status page show the refusals."""
    target = CountingListener()
    try:
        gw = start(gateway, upstream=fleet.ALLOW_LOOPBACK)
        base = f"http://{HOST}:{target.port}"
        bad = {
            "query": base + "/idx/_search?q=",
            "fragment": base + "/v1#x",
            "userinfo": f"http://a:b@{HOST}:{target.port}",
            "dots": base + "/../admin",
            "encoded": base + "/%2e%2e/admin",
            "ftp": f"ftp://{HOST}:{target.port}",
        }
        for i, (what, url) in enumerate(bad.items()):
            r = heartbeat(gw, hb_body(f"evil-{i}", url))
            e = g.check_error(r, 400, "url_not_allowed", what=what)
            assert e["message"].startswith("url: "), e
        # without the fleet secret (a stranger's own key): refused too, but not listed
        g.check_error(heartbeat(gw, hb_body("stranger", bad["query"]), secret=None), 400,
                      "url_not_allowed")
        assert replicas(gw) == {}
        g.check_error(g.chat(gw), 404, "model_not_found")
        time.sleep(T(1.5))  # a few probe intervals: nothing may have been probed either
        assert target.count == 0

        st = admin(gw, "/admin/v1/status")
        refused = st["refused_registrations"]
        assert [e["id"] for e in refused] == [f"evil-{i}" for i in reversed(range(len(bad)))], refused
        first = refused[-1]
        assert first["url"] == bad["query"] and first["peer"].startswith("127.0.0.1"), first
        assert first["reason"].startswith("url_not_allowed: url: the URL may not have a query"), first
        assert isinstance(first["time_ms"], (int, float)) and first["time_ms"] > 1.7e12
        m = metrics(gw)
        assert m['fleetgate_registrations_refused_total{reason="url_not_allowed"}'] == len(bad), m
        page = requests.get(gw.admin_url + "/", timeout=T(5)).text
        assert "Refused registrations" in page and 'id="refused"' in page
        assert any(r["msg"] == "heartbeat refused" and "query" in r.get("reason", "")
                   for r in g.log_records(gw))
    finally:
        target.close()


def test_loopback_replicas_get_no_connection_without_allow(gateway):
    """allow_addresses empty: a replica at 127.0.0.1 (file, http or https), or at a name
    resolving to loopback (file or heartbeat), never gets a connection, probes included,
    and shows down with the reason; a heartbeat naming 127.0.0.1 is refused outright."""
    target = CountingListener()
    try:
        p = target.port
        reps = [{"id": "file-ip", "url": f"http://127.0.0.1:{p}", "models": [g.MODEL], "slots": 1},
                {"id": "file-tls", "url": f"https://127.0.0.1:{p}", "models": [g.MODEL], "slots": 1},
                {"id": "file-name", "url": f"http://localhost:{p}/v1prefix", "models": [g.MODEL],
                 "slots": 1},
                {"id": "file-mapped", "url": f"http://[::ffff:127.0.0.1]:{p}", "models": [g.MODEL],
                 "slots": 1}]
        gw = start(gateway, reps, upstream={"allow_http": True, "allow_addresses": []})
        r = heartbeat(gw, hb_body("hb-ip", f"http://127.0.0.1:{p}"))
        e = g.check_error(r, 400, "url_not_allowed")
        assert "address 127.0.0.1 refused by upstream.allow_addresses (loopback)" in e["message"], e
        r = heartbeat(gw, hb_body("hb-name", f"http://localhost:{p}"))
        assert r.status_code == 200, r.text  # a name: judged where it connects
        wait_down(gw, "file-ip", "address 127.0.0.1 refused by upstream.allow_addresses (loopback)")
        wait_down(gw, "file-tls", "address 127.0.0.1 refused by upstream.allow_addresses (loopback)")
        wait_down(gw, "file-mapped", "address ::ffff:127.0.0.1 refused by upstream.allow_addresses (loopback)")
        wait_down(gw, "file-name", "refused by upstream.allow_addresses (loopback)")
        wait_down(gw, "hb-name", "refused by upstream.allow_addresses (loopback)")
        # a request finds no phone it may reach, and reaches none
        r = g.chat(gw, timeout=T(20), headers={"x-fleetgate-timeout": "2"})
        assert r.status_code != 200, r.text
        time.sleep(T(1.5))
        assert target.count == 0
        downs = g.log_msgs(gw, "replica state changed", replica="file-ip", to="down")
        assert downs and "refused by upstream.allow_addresses" in downs[0]["reason"], downs
        assert "hb-ip" not in replicas(gw)
        assert [x["id"] for x in admin(gw, "/admin/v1/status")["refused_registrations"]] == ["hb-ip"]
    finally:
        target.close()


def test_private_address_is_refused(gateway):
    """10.255.255.1 routes nowhere, so nothing could be observed there: the refusal's
    reason comes at once (not after the connect timeout) and the metric counts it."""
    reps = [{"id": "lan", "url": "https://10.255.255.1:9200", "models": [g.MODEL], "slots": 1},
            {"id": "meta", "url": "http://169.254.169.254", "models": [g.MODEL], "slots": 1}]
    gw = start(gateway, reps, upstream={"allow_http": True, "connect_timeout_s": 30},
               health={"timeout_s": 30})
    t0 = time.monotonic()
    wait_down(gw, "lan", "address 10.255.255.1 refused by upstream.allow_addresses (private)")
    wait_down(gw, "meta", "address 169.254.169.254 refused by upstream.allow_addresses (link-local)")
    assert time.monotonic() - t0 < T(6)
    for rid, url in (("hb-lan", "http://10.0.0.7:9200"), ("hb-cgnat", "https://100.64.1.1"),
                     ("hb-v6", "https://[fd00::1]:443"), ("hb-zero", "http://0.0.0.0:9")):
        e = g.check_error(heartbeat(gw, hb_body(rid, url)), 400, "url_not_allowed", what=url)
        assert "refused by upstream.allow_addresses" in e["message"], e
    assert set(replicas(gw)) == {"lan", "meta"}
    m = metrics(gw)
    assert m['fleetgate_registrations_refused_total{reason="url_not_allowed"}'] == 4, m


def test_special_purpose_ranges_are_refused(sim, gateway):
    """IANA's special-purpose ranges that are not globally reachable, beyond the private
    ones: local-use NAT64 (RFC 8215), IETF protocol assignments, benchmarking (RFC 2544),
    documentation, the deprecated 6to4 relays, and IPv4 forms inside IPv6 judged by the
    IPv4 address they carry. Replicas from the file are down with the class at once (no
    connection is tried: nothing there could be observed), heartbeats naming them are
    refused, while a loopback phone that the allow list names serves beside them."""
    phone = g.phone(sim, "lo")
    reps = [g.replica(phone),
            {"id": "nat64-local", "url": "https://[64:ff9b:1::a00:7]:9200", "models": [g.MODEL], "slots": 1},
            {"id": "bench", "url": "https://198.18.0.1", "models": [g.MODEL], "slots": 1},
            {"id": "ietf", "url": "https://192.0.0.8", "models": [g.MODEL], "slots": 1}]
    gw = start(gateway, reps, upstream={"allow_http": True, "allow_addresses": ["127.0.0.0/8"],
                                        "connect_timeout_s": 30}, health={"timeout_s": 30})
    t0 = time.monotonic()
    wait_down(gw, "nat64-local", "address 64:ff9b:1::a00:7 refused by upstream.allow_addresses (nat64-local)")
    wait_down(gw, "bench", "address 198.18.0.1 refused by upstream.allow_addresses (benchmarking)")
    wait_down(gw, "ietf", "address 192.0.0.8 refused by upstream.allow_addresses (protocol)")
    assert time.monotonic() - t0 < T(6)
    bad = {"https://[64:ff9b:1::1]": "nat64-local", "https://198.19.255.1:8443": "benchmarking",
           "https://192.0.0.170": "protocol", "https://192.88.99.1": "reserved",
           "https://192.0.2.10": "documentation", "https://[2001:db8::7]": "documentation",
           "https://[2001:2::1]": "benchmarking", "https://[2002:c612:1::1]": "benchmarking",
           "https://[64:ff9b::c612:1]": "benchmarking", "https://[::ffff:100.64.0.1]": "shared",
           "https://[2001::1]": "protocol"}
    for i, (url, cls) in enumerate(bad.items()):
        e = g.check_error(heartbeat(gw, hb_body(f"hb-{i}", url)), 400, "url_not_allowed", what=url)
        assert f"refused by upstream.allow_addresses ({cls})" in e["message"], (url, e)
    assert set(replicas(gw)) == {"lo", "nat64-local", "bench", "ietf"}
    fleet.wait_until(lambda: replicas(gw)["lo"]["state"] == "ready", T(6), what="loopback phone ready")
    assert g.check_chat_ok(g.chat(gw), "lo")
    m = metrics(gw)
    assert m['fleetgate_registrations_refused_total{reason="url_not_allowed"}'] == len(bad), m


def test_http_needs_allow_http(gateway, tmp_path):
    """Without upstream.allow_http, http:// fails at config load (file:line:col, naming
    the setting) and in heartbeats; https is accepted."""
    f = tmp_path / "c.json"
    f.write_text('{"replicas": [\n  {"id": "p", "url": "http://phone.example", "models": ["m"]}]}\n')
    p = subprocess.run([fleet.gateway_bin(), "--check-config", str(f)], capture_output=True,
                       text=True, timeout=T(10))
    assert p.returncode == 1
    assert f"{f}:2:22: replicas[0].url: plain http:// is not allowed (set upstream.allow_http)" \
        in p.stderr, p.stderr
    f.write_text('{"upstream": {"allow_http": true},\n'
                 ' "replicas": [{"id": "p", "url": "http://phone.example", "models": ["m"]}]}\n')
    p = subprocess.run([fleet.gateway_bin(), "--check-config", str(f)], capture_output=True,
                       text=True, timeout=T(10))
    assert p.returncode == 0, p.stderr
    gw = start(gateway, upstream={})
    e = g.check_error(heartbeat(gw, hb_body("plain", "http://phone.example:8080")), 400,
                      "url_not_allowed")
    assert "plain http:// is not allowed (set upstream.allow_http)" in e["message"], e
    r = heartbeat(gw, hb_body("tls", "https://phone.example:8443"))
    assert r.status_code == 200, r.text
    assert set(replicas(gw)) == {"tls"}


def test_the_gateways_own_ports_are_refused_even_when_loopback_is_allowed(gateway):
    """127.0.0.0/8 allowed (as in the tests and the demo): still, neither the admin port
    nor the client port can be a phone."""
    def cfg_reps(ports):
        return [{"id": "admin-port", "url": f"http://127.0.0.1:{ports[1]}/admin/v1",
                 "models": [g.MODEL], "slots": 1},
                {"id": "self", "url": f"http://localhost:{ports[0]}", "models": [g.MODEL], "slots": 1}]

    def cfg(ports):
        c = g.gw_config(ports[0], cfg_reps(ports), health={"interval_s": 0.3})
        c["fleet"] = {"secret_env": "FG_ATTACK_SECRET"}
        c["admin"] = {"listen": f"{HOST}:{ports[1]}", "token": ADMIN_TOKEN}
        return c
    gw = gateway(cfg, n_ports=2, env={"FG_ATTACK_SECRET": SECRET})
    gw.admin_url = f"http://{HOST}:{gw.ports[1]}"
    wait_down(gw, "admin-port", f"port {gw.ports[1]} refused: it is this gateway's admin listener")
    wait_down(gw, "self", f"port {gw.ports[0]} refused: it is this gateway's own listener")
    e = g.check_error(heartbeat(gw, hb_body("hb-admin", f"http://127.0.0.1:{gw.ports[1]}")), 400,
                      "url_not_allowed")
    assert "admin listener" in e["message"], e
    assert "hb-admin" not in replicas(gw)


def test_loopback_phone_serves_when_allowed(sim, gateway):
    """The legitimate path: with 127.0.0.0/8 allowed, the same kind of phone, from a file
    and by heartbeat under a name, serves."""
    a = g.phone(sim, "allowed-file")
    b = g.phone(sim, "allowed-hb")
    gw = start(gateway, [g.replica(a)],
               upstream={"allow_http": True, "allow_addresses": ["127.0.0.0/8", "::1/128"]})
    fleet.wait_until(lambda: (g.replicas_ready(gw) or 0) >= 1, T(6), what="file phone ready")
    assert g.check_chat_ok(g.chat(gw), "allowed-file")
    r = heartbeat(gw, dict(hb_body("allowed-hb", f"http://localhost:{b.port}"), slots=1,
                           prefill_tps=b.real_prefill, decode_tps=b.real_decode))
    assert r.status_code == 200, r.text
    fleet.wait_until(lambda: (g.replicas_ready(gw) or 0) >= 2, T(6), what="heartbeat phone ready")
    time.sleep(T(1))  # a few probes: the name's address passes the gate
    assert replicas(gw)["allowed-hb"]["state"] == "ready", replicas(gw)["allowed-hb"]
    with concurrent.futures.ThreadPoolExecutor(4) as ex:  # two one-slot phones: both serve
        served = {r.headers.get("x-fleetgate-replica")
                  for r in ex.map(lambda _: g.chat(gw, max_tokens=16), range(8))}
    assert served == {"allowed-file", "allowed-hb"}, served
    assert admin(gw, "/admin/v1/status")["refused_registrations"] == []
