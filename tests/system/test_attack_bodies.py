"""Bodies before keys (issue 16): the gateway decides from a request's headers, before
it reads a byte of the body or invites it with 100 Continue, whether the request can be
served at all. Unauthenticated clients announcing 8 MiB bodies get their 401 at once and
cost the gateway no memory; heartbeats and admin requests have small body caps checked
from Content-Length; and one budget bounds the body bytes all connections hold together
(limits.body_budget_bytes: 503 server_busy with Retry-After past it), taken as body
bytes arrive, never on the word of a Content-Length. Routes that read no body refuse one.

Everything is sent on raw sockets so the test sees exactly what the gateway answers and
when: a 100 Continue would show up as an interim response before the final one."""

import hashlib
import json
import time

import requests

import fleet
import gwutil as g
from fleet import HOST, T
from gwutil import CHAT, MODEL, RawConn, phone, replica

KEY = "sk-attack-bodies-legit-0123"
KEYS = [{"name": "legit", "key_sha256": hashlib.sha256(KEY.encode()).hexdigest()}]
TOKEN_ENV = "FG_ATTACK_ADMIN_TOKEN"
TOKEN = "admin-token-for-the-attack-tests"
SECRET_ENV = "FG_ATTACK_FLEET_SECRET"
SECRET = "fleet-secret-for-the-attack-tests"
EIGHT_MIB = 8 << 20


def start(gateway, sim, limits=None, fleet_section=False, **kw):
    """A gateway with API keys, an admin listener and one sim; ready when it is."""
    p = phone(sim, "p0", slots=4, decode_tps=100)

    def config(ports):
        cfg = g.gw_config(ports[0], [replica(p)], limits=limits, api_keys=KEYS, **kw)
        cfg["admin"] = {"listen": f"{HOST}:{ports[1]}", "token_env": TOKEN_ENV}
        if fleet_section:
            cfg["fleet"] = {"secret_env": SECRET_ENV}
        return cfg

    d = gateway(config, n_ports=2, env={TOKEN_ENV: TOKEN, SECRET_ENV: SECRET},
                ready=lambda d: (g.replicas_ready(d) or 0) >= 1)
    d.admin_port = d.ports[1]
    return d


def head(path, length=None, expect=False, headers=None, chunked=False):
    lines = [f"POST {path} HTTP/1.1", "Host: gw", "Content-Type: application/json"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    if expect:
        lines.append("Expect: 100-continue")
    for k, v in (headers or {}).items():
        lines.append(f"{k}: {v}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def final_response(c, timeout):
    """The first response on c and whether an interim 1xx came before it."""
    interim = False
    for _ in range(5):
        status, hdrs, body = c.read_response(timeout=timeout)
        if status >= 200:
            return status, hdrs, body, interim
        interim = True
    raise AssertionError("only interim responses")


def vm_rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def metric(d, name):
    r = requests.get(f"http://{HOST}:{d.admin_port}/metrics",
                     headers={"Authorization": f"Bearer {TOKEN}"}, timeout=T(5))
    assert r.status_code == 200, r.text
    return fleet.parse_prometheus(r.text).get(name)


def padded_chat(size, max_tokens=4):
    """A valid chat body of exactly `size` bytes: JSON whitespace pads it, so the prompt
    (and the phone's work) stays tiny whatever the size."""
    tail = json.dumps({"model": MODEL, "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": "hi"}]})[1:]
    pad = size - 1 - len(tail)
    assert pad >= 0
    return b"{" + b" " * pad + tail.encode()


def keyed_chat(d):
    return requests.post(d.url + CHAT, json=fleet.chat_body("hello", model=MODEL),
                         headers={"Authorization": f"Bearer {KEY}"}, timeout=T(20))


# ---------------------------------------------------------------------------- 401 first

def test_unauthenticated_8mib_bodies_get_401_at_the_headers(sim, gateway):
    d = start(gateway, sim)
    rss0 = vm_rss_kib(d.pid)
    n = 240
    conns = []
    try:
        t0 = time.monotonic()
        for i in range(n):
            c = RawConn(d.port, timeout=T(10))
            auth = {"Authorization": "Bearer sk-wrong"} if i % 3 == 2 else None
            c.send(head(CHAT, EIGHT_MIB, expect=i % 2 == 0, headers=auth))
            conns.append(c)
        # every one answered 401 from its headers alone: no 100 Continue, no body read
        for i, c in enumerate(conns):
            status, hdrs, body, interim = final_response(c, T(10))
            assert status == 401, (i, status, body[:200])
            assert not interim, f"connection {i} was invited to send its body"
            e = g.check_error_body(body.decode(), 401, "invalid_api_key")
            assert e["message"].startswith("Incorrect" if i % 3 == 2 else "You didn't"), e
            assert hdrs.get("connection") == "close", hdrs
            assert hdrs.get("x-request-id"), hdrs
        took = time.monotonic() - t0
        assert took <= T(15), took
        # a client that sends its body anyway (no Expect) has it discarded, not kept:
        # push 1 MiB into a few of them and watch the gateway's memory and the gauge
        junk = b"x" * (64 << 10)
        for c in conns[1:40:2]:
            try:
                for _ in range(16):
                    c.sock.sendall(junk)
            except OSError:
                pass  # closed under us after the lingering close: that is fine too
        # meanwhile a client with the key is served as usual
        r = keyed_chat(d)
        g.check_chat_ok(r)
        assert metric(d, "fleetgate_body_bytes_buffered") == 0
        rss1 = vm_rss_kib(d.pid)
        # 240 x 8 MiB would be ~2 GiB; the gateway grew by a few MiB at most
        assert rss1 - rss0 < 40 * 1024, (rss0, rss1)
        # and every refused connection is closed by the gateway
        for i, c in enumerate(conns):
            assert c.wait_closed(T(5)), f"connection {i} still open"
    finally:
        for c in conns:
            c.close()
    # nothing of it reached the phone, and the gateway still serves
    g.check_chat_ok(keyed_chat(d))


def test_a_keyed_client_with_expect_still_gets_100_continue(sim, gateway):
    d = start(gateway, sim)
    body = json.dumps(fleet.chat_body("hello", model=MODEL)).encode()
    c = RawConn(d.port, timeout=T(10))
    try:
        c.send(head(CHAT, len(body), expect=True, headers={"Authorization": f"Bearer {KEY}"}))
        status, _, _ = c.read_response(timeout=T(5))
        assert status == 100
        c.send(body)
        status, hdrs, resp = c.read_response(timeout=T(20))
        assert status == 200, resp[:300]
        assert hdrs.get("connection") != "close", hdrs
        # the connection stays usable; an unkeyed request on it gets 401 and closes it
        c.send(head(CHAT, EIGHT_MIB, expect=True))
        status, hdrs, resp, interim = final_response(c, T(5))
        assert (status, interim) == (401, False), resp[:300]
        assert c.wait_closed(T(5))
    finally:
        c.close()


def test_a_request_without_a_body_keeps_its_connection(sim, gateway):
    """Only a body is worth refusing early: a bodiless request without a key gets the same
    401 from the handler and the connection stays open."""
    d = start(gateway, sim)
    c = RawConn(d.port, timeout=T(10))
    try:
        for _ in range(2):
            c.send(b"GET /v1/models HTTP/1.1\r\nHost: gw\r\n\r\n")
            status, hdrs, body = c.read_response(timeout=T(5))
            assert status == 401, body[:200]
            assert hdrs.get("connection") != "close", hdrs
        c.send(b"GET /v1/models HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " + KEY.encode() +
               b"\r\n\r\n")
        status, _, body = c.read_response(timeout=T(5))
        assert status == 200 and json.loads(body)["data"][0]["id"] == MODEL, body[:200]
    finally:
        c.close()


def test_client_api_without_keys_is_unchanged(sim, gateway):
    """No api_keys: the head hook lets chat through (the body limit is the server's), and
    other routes take no body: a wrong method is answered from the headers, a GET with a
    body is too large for its 0 bytes."""
    p = phone(sim, "p0")
    d = g.start_gateway(gateway, [replica(p)])
    c = RawConn(d.port, timeout=T(10))
    try:
        c.send(head(CHAT, 4096, expect=True))
        status, _, _ = c.read_response(timeout=T(5))
        assert status == 100
    finally:
        c.close()
    c = RawConn(d.port, timeout=T(10))
    try:
        c.send(head("/v1/models", 1 << 20, expect=True))
        status, _, body, interim = final_response(c, T(5))
        assert (status, interim) == (405, False), body[:200]
    finally:
        c.close()
    c = RawConn(d.port, timeout=T(10))
    try:
        c.send(head("/v1/models", 1, expect=True).replace(b"POST ", b"GET ", 1))
        status, _, body, interim = final_response(c, T(5))
        assert (status, interim) == (413, False), body[:200]
    finally:
        c.close()


# ---------------------------------------------------------------------------- heartbeats

def test_heartbeat_bodies_are_refused_before_they_are_read(sim, gateway):
    d = start(gateway, sim, fleet_section=True)
    hb = "/fleet/v1/heartbeat"
    # unsigned, 8 MiB announced: 401 at once
    for expect in (True, False):
        c = RawConn(d.port, timeout=T(10))
        try:
            c.send(head(hb, EIGHT_MIB, expect=expect))
            status, _, body, interim = final_response(c, T(5))
            assert (status, interim) == (401, False), body[:200]
            e = g.check_error_body(body.decode(), 401, "missing_signature")
            assert e["type"] == "authentication_error", e
            assert c.wait_closed(T(5))
        finally:
            c.close()
    # a stale or malformed timestamp is refused from the headers too
    for ts, code in (("soon", "invalid_timestamp"), (str(int(time.time() * 1000) - 3600_000),
                                                      "stale_timestamp")):
        c = RawConn(d.port, timeout=T(10))
        try:
            c.send(head(hb, EIGHT_MIB, expect=True,
                        headers={"x-fleetgate-timestamp": ts, "x-fleetgate-key-signature": "x"}))
            status, _, body, interim = final_response(c, T(5))
            assert (status, interim) == (401, False), body[:200]
            g.check_error_body(body.decode(), 401, code)
        finally:
            c.close()
    # signature headers present (the signatures themselves need the body), 1 MiB: 413 at once
    signed = {"x-fleetgate-timestamp": str(int(time.time() * 1000)),
              "x-fleetgate-signature": "sha256=" + "0" * 64,
              "x-fleetgate-key-signature": "A" * 86}
    for expect in (True, False):
        c = RawConn(d.port, timeout=T(10))
        try:
            c.send(head(hb, 1 << 20, expect=expect, headers=signed))
            status, _, body, interim = final_response(c, T(5))
            assert (status, interim) == (413, False), body[:200]
            g.check_error_body(body.decode(), 413, "request_too_large")
        finally:
            c.close()
    # chunked: refused as soon as the body passes 64 KiB, though more is promised
    c = RawConn(d.port, timeout=T(10))
    try:
        c.send(head(hb, None, chunked=True, headers=signed))
        chunk = b"x" * 16384
        got413 = False
        for _ in range(64):  # up to 1 MiB, stopping at the answer
            try:
                c.send(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            except OSError:
                break
            if c.read_until(b"HTTP/1.1 413", 0.05):
                got413 = True
                break
        assert got413 or c.read_until(b"HTTP/1.1 413", T(3)), c.buf[:300]
    finally:
        c.close()
    # a small, wrongly signed heartbeat is read and then refused by the heartbeat handler
    body = b'{"id":"x"}'
    c = RawConn(d.port, timeout=T(10))
    try:
        c.send(head(hb, len(body), headers=signed) + body)
        status, _, resp = c.read_response(timeout=T(5))
        code = json.loads(resp)["error"]["code"]
        assert status in (400, 401) and code not in ("missing_signature", "request_too_large"), resp
    finally:
        c.close()
    assert metric(d, "fleetgate_body_bytes_buffered") == 0


def test_heartbeats_disabled_refused_before_the_body(sim, gateway):
    d = start(gateway, sim)  # no fleet section
    c = RawConn(d.port, timeout=T(10))
    try:
        c.send(head("/fleet/v1/heartbeat", EIGHT_MIB, expect=True))
        status, _, body, interim = final_response(c, T(5))
        assert (status, interim) == (404, False), body[:200]
        g.check_error_body(body.decode(), 404, "heartbeats_disabled")
    finally:
        c.close()


# ---------------------------------------------------------------------------- admin API

def test_admin_api_without_token_gets_401_before_the_body(sim, gateway):
    d = start(gateway, sim)
    for path, auth, want, code in [
            ("/admin/v1/reload", None, 401, "missing_admin_token"),
            ("/admin/v1/replicas/p0/drain", "Bearer not-the-token", 401, "invalid_admin_token"),
            ("/admin/v1/reload", f"Bearer {TOKEN}", 413, "request_too_large")]:
        for expect in (True, False):
            c = RawConn(d.admin_port, timeout=T(10))
            try:
                c.send(head(path, 1 << 20, expect=expect,
                            headers={"Authorization": auth} if auth else None))
                status, hdrs, body, interim = final_response(c, T(5))
                assert (status, interim) == (want, False), (path, status, body[:200])
                e = g.check_error_body(body.decode(), want, code)
                if want == 401:
                    assert e["type"] == "authentication_error", e
                    assert hdrs.get("www-authenticate", "").startswith("Bearer"), hdrs
                assert c.wait_closed(T(5))
            finally:
                c.close()
    # with the token and a small body: 100 Continue, then the answer, as before
    c = RawConn(d.admin_port, timeout=T(10))
    try:
        c.send(head("/admin/v1/reload", 2, expect=True,
                    headers={"Authorization": f"Bearer {TOKEN}"}))
        status, _, _ = c.read_response(timeout=T(5))
        assert status == 100
        c.send(b"{}")
        status, _, body = c.read_response(timeout=T(10))
        assert status == 200, body[:300]
    finally:
        c.close()


# ---------------------------------------------------------------------------- the budget

def test_the_body_budget_refuses_past_it_and_serves_again_once_bodies_are_freed(sim, gateway):
    mib = 1 << 20
    d = start(gateway, sim, limits={"body_budget_bytes": 3 * mib})
    auth = {"Authorization": f"Bearer {KEY}"}
    body = padded_chat(mib)
    held = []
    try:
        # three keyed requests announce 1 MiB each and send all but 16 bytes: the budget
        # (which counts the bytes that arrived) is all but full
        for _ in range(3):
            c = RawConn(d.port, timeout=T(20))
            c.send(head(CHAT, mib, headers=auth) + body[:-16])
            held.append(c)
        full = 3 * (mib - 16)
        assert fleet.wait_until(lambda: metric(d, "fleetgate_body_bytes_buffered") == full,
                                T(5)), metric(d, "fleetgate_body_bytes_buffered")
        # the next one is refused with the body bytes that would pass the budget:
        # 503 server_busy, Retry-After, the connection closed
        for expect in (True, False):
            c = RawConn(d.port, timeout=T(10))
            try:
                c.send(head(CHAT, mib, expect=expect, headers=auth))
                if expect:  # announcing takes nothing: it is invited like any other
                    status, _, _ = c.read_response(timeout=T(5))
                    assert status == 100
                c.send(body[:64])
                status, hdrs, resp = c.read_response(timeout=T(5))
                assert status == 503, resp[:300]
                e = g.check_error_body(resp.decode(), 503, "server_busy")
                assert e["type"] == "server_error", e
                assert hdrs.get("retry-after", "").isdigit() and int(hdrs["retry-after"]) >= 1, hdrs
                assert hdrs.get("x-request-id"), hdrs
                assert hdrs.get("connection") == "close", hdrs
                assert c.wait_closed(T(5))
            finally:
                c.close()
        # a chunked body likewise, with its first bytes
        c = RawConn(d.port, timeout=T(10))
        try:
            c.send(head(CHAT, None, chunked=True, headers=auth) + b"40\r\n" + b" " * 64 + b"\r\n")
            status, _, resp = c.read_response(timeout=T(5))
            assert status == 503, resp[:300]
        finally:
            c.close()
        assert metric(d, "fleetgate_body_bytes_buffered") == full
        # the held requests finish (filling the budget exactly) and are served
        for c in held:
            c.send(body[-16:])
        for c in held:
            status, _, resp = c.read_response(timeout=T(30))
            assert status == 200, resp[:300]
        # their bodies were freed: the budget is empty and a large body is served again
        assert fleet.wait_until(lambda: metric(d, "fleetgate_body_bytes_buffered") == 0, T(5))
        r = requests.post(d.url + CHAT, data=padded_chat(2 * mib), timeout=T(30),
                          headers=dict(auth, **{"Content-Type": "application/json"}))
        g.check_chat_ok(r)
        g.check_chat_ok(keyed_chat(d))
    finally:
        for c in held:
            c.close()


def test_a_body_that_passes_the_budget_part_way_gets_503(sim, gateway):
    """The budget is taken as bytes arrive: a body larger than what is left is let in,
    and refused (503, connection closed) at the bytes that would pass the budget."""
    mib = 1 << 20
    d = start(gateway, sim, limits={"body_budget_bytes": mib})
    auth = {"Authorization": f"Bearer {KEY}"}
    body = padded_chat(2 * mib)
    c = RawConn(d.port, timeout=T(10))
    try:
        c.send(head(CHAT, len(body), headers=auth))
        got = False
        for off in range(0, len(body), 64 << 10):
            try:
                c.send(body[off:off + (64 << 10)])
            except OSError:
                break
            if c.read_until(b"HTTP/1.1 503", 0.05):
                got = True
                break
        assert got or c.read_until(b"HTTP/1.1 503", T(3)), c.buf[:300]
        assert b"server_busy" in c.buf or c.read_until(b"server_busy", T(3)), c.buf[:300]
        assert c.wait_closed(T(5))
    finally:
        c.close()
    assert fleet.wait_until(lambda: metric(d, "fleetgate_body_bytes_buffered") == 0, T(5))
    g.check_chat_ok(keyed_chat(d))


def test_a_client_that_leaves_mid_body_gives_its_budget_back(sim, gateway):
    mib = 1 << 20
    d = start(gateway, sim, limits={"body_budget_bytes": 2 * mib})
    auth = {"Authorization": f"Bearer {KEY}"}
    for _ in range(3):  # more than the budget holds, one after the other
        c = RawConn(d.port, timeout=T(10))
        c.send(head(CHAT, 2 * mib, headers=auth) + b"{" + b" " * 1000)
        # it holds the bytes it sent, not the 2 MiB it announced
        assert fleet.wait_until(lambda: metric(d, "fleetgate_body_bytes_buffered") == 1001,
                                T(5)), metric(d, "fleetgate_body_bytes_buffered")
        c.close()
        assert fleet.wait_until(lambda: metric(d, "fleetgate_body_bytes_buffered") == 0, T(5))


def test_idle_announcers_without_a_key_hold_no_budget(sim, gateway):
    """The finding: clients without a key announced 64 KiB bodies on /healthz, unknown
    paths or a heartbeat (a plausible timestamp passes its head check), sent nothing, and
    each took 64 KiB of the budget from its headers for the body timeout; 16 of them
    filled a 1 MiB budget and a keyed completion got 503. Now the routes that read no
    body refuse one (413 from the Content-Length), and what is let in takes budget only
    as its bytes arrive."""
    d = start(gateway, sim, limits={"body_budget_bytes": 1 << 20}, fleet_section=True)
    kib64 = 64 << 10
    hb = {"x-fleetgate-timestamp": str(int(time.time() * 1000)),
          "x-fleetgate-signature": "sha256=" + "0" * 64,
          "x-fleetgate-key-signature": "A" * 86}
    key = {"Authorization": f"Bearer {KEY}"}
    refused = [("GET", "/healthz", None, 413, "request_too_large"),
               ("GET", "/readyz", None, 413, "request_too_large"),
               ("GET", "/v1/models", key, 413, "request_too_large"),
               ("POST", "/healthz", None, 405, "method_not_allowed"),
               ("POST", "/nope", None, 404, "unknown_url"),
               ("GET", CHAT, None, 405, "method_not_allowed"),
               ("POST", "/v1/models", key, 405, "method_not_allowed")]
    conns = []
    try:
        # the routes that read no body answer from the headers: nothing invited or read,
        # the connection closed (a body on a GET route is too large for its 0 bytes)
        for method, path, hdrs, want, code in refused:
            for expect in (True, False):
                c = RawConn(d.port, timeout=T(10))
                try:
                    data = head(path, kib64, expect=expect, headers=hdrs)
                    c.send(data.replace(b"POST ", method.encode() + b" ", 1))
                    status, rh, body, interim = final_response(c, T(5))
                    assert (status, interim) == (want, False), (method, path, status, body[:200])
                    g.check_error_body(body.decode(), want, code)
                    assert rh.get("connection") == "close", rh
                    assert c.wait_closed(T(5))
                finally:
                    c.close()
        for path in ("/healthz", "/nope"):  # the admin listener alike
            c = RawConn(d.admin_port, timeout=T(10))
            try:
                c.send(head(path, kib64))
                status, _, body, _ = final_response(c, T(5))
                assert status == 413, body[:200]
            finally:
                c.close()
        # 24 idle heartbeats announcing 64 KiB (more than the budget) and 16 on /healthz
        for i in range(40):
            c = RawConn(d.port, timeout=T(10))
            c.send(head("/fleet/v1/heartbeat" if i < 24 else "/healthz", kib64,
                        headers=hb if i < 24 else None))
            conns.append(c)
        time.sleep(0.3)
        assert metric(d, "fleetgate_body_bytes_buffered") == 0
        # a keyed completion is served meanwhile
        g.check_chat_ok(keyed_chat(d))
        assert metric(d, "fleetgate_body_bytes_buffered") == 0
        for c in conns[24:]:
            status, _, body = c.read_response(timeout=T(5))
            assert status == 405, body[:200]
    finally:
        for c in conns:
            c.close()
