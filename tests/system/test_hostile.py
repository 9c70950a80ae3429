"""Hostile input against the gateway's HTTP/1.1 front (issue 6, "Hostile input"): request
smuggling and malformed requests from RFC 9112's rules and public request-smuggling
research (CL.TE, TE.CL, TE.TE obfuscations, bad lengths and chunk sizes, bare LF/CR,
obs-fold, NUL bytes, bad names, request-line garbage, HTTP/0.9 and HTTP/2 on the HTTP/1
port), size limits (431, 413) and hostile JSON (invalid UTF-8, deep nesting, huge arrays).

Each case is sent byte for byte on a raw socket. It must get a clear 4xx (an OpenAI-shaped
body where one is sent), the connection must be closed afterwards when the framing is in
doubt, and nothing may reach the phone: a tap between the gateway and the sim counts
every POST the phone is sent, and the sim's own token counters must not move. A normal
request on a fresh connection must still be served afterwards (which also proves the
tap sees requests). Slow clients (headers or body dribbled in) are cut off after
limits.header_timeout_s (the body gets 6x that) while others are served normally.

Every wait is bounded; upper time bounds go through T()."""

import json
import re
import select
import socket
import threading
import time

import pytest

import fleet
import gwutil as g
from fleet import HOST, T
from gwutil import CHAT, MODEL, chat, check_chat_ok, phone, replica

# ---------------------------------------------------------------------------- the tap

_REQ_LINE = re.compile(rb"(?:^|\n)POST (\S+) HTTP/1\.[01]\r?\n")


class Tap:
    """A TCP relay between the gateway and a sim that keeps every byte the gateway sends
    upstream, so a test can count the POSTs that reached the phone, whatever the phone
    would have made of them. Threads are daemons; close() ends them all."""

    CAP = 16 << 20  # bytes kept per connection

    def __init__(self, target_port):
        self.target = target_port
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind((HOST, 0))
        self.lsock.listen(64)
        self.port = self.lsock.getsockname()[1]
        self.streams = []  # bytearray per upstream connection (gateway -> phone)
        self.skip = {}     # id(stream) -> bytes of it forgotten (forget)
        self.socks = []
        self.lock = threading.Lock()
        self.closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self):
        return f"http://{HOST}:{self.port}"

    def _accept(self):
        for _ in range(100000):  # bounded: one per upstream connection
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            try:
                u = socket.create_connection((HOST, self.target), timeout=5)
                u.settimeout(None)
            except OSError:
                c.close()
                continue
            buf = bytearray()
            with self.lock:
                if self.closing:
                    c.close()
                    u.close()
                    return
                self.streams.append(buf)
                self.socks += [c, u]
            threading.Thread(target=self._pump, args=(c, u, buf), daemon=True).start()
            threading.Thread(target=self._pump, args=(u, c, None), daemon=True).start()

    def _pump(self, src, dst, keep):
        while True:
            try:
                b = src.recv(65536)
            except OSError:
                b = b""
            if not b:
                break
            if keep is not None and len(keep) < self.CAP:
                with self.lock:
                    keep += b
            try:
                dst.sendall(b)
            except OSError:
                break
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def posts(self):
        """The targets of every POST the phone was sent so far."""
        with self.lock:
            return [m.group(1).decode("latin-1") for s in self.streams
                    for m in _REQ_LINE.finditer(bytes(s)[self.skip.get(id(s), 0):])]

    def seen(self, needle):
        """Whether any connection carried these bytes."""
        with self.lock:
            return any(needle in s for s in self.streams)

    def forget(self):
        """What was sent so far is no longer counted by posts()."""
        with self.lock:
            self.skip = {id(s): len(s) for s in self.streams}

    def close(self):
        with self.lock:
            self.closing = True
            socks = list(self.socks)
        try:
            self.lsock.close()
        except OSError:
            pass
        for s in socks:
            try:
                s.close()
            except OSError:
                pass


@pytest.fixture
def guarded(sim, gateway):
    """A sim behind a tap behind a gateway with small limits. Yields (gateway, sim, tap)."""
    p = phone(sim, "target", slots=2)
    tap = Tap(p.port)
    gw = g.start_gateway(gateway, [replica(p, url=tap.url)],
                         limits={"header_timeout_s": 2, "idle_timeout_s": 5,
                                 "max_body_bytes": 4 << 20})
    # the gateway asks a bare llama-server what it serves (three requests it refuses at
    # once, /v1/responses last: docs/agent.md "What the engine serves"); they are not the
    # tests' requests
    assert fleet.wait_until(lambda: tap.seen(b"POST /v1/responses "), T(10)), tap.posts()
    time.sleep(0.2)  # (its answer)
    tap.forget()
    try:
        yield gw, p, tap
    finally:
        tap.close()


def phone_counters(p):
    m = p.metrics(timeout=T(3))
    return (m["llamacpp:prompt_tokens_total"], m["llamacpp:tokens_predicted_total"])


def assert_nothing_reached(gw, p, tap, before, what):
    time.sleep(0.3)  # a request the gateway took would be on its way upstream by now
    posts = tap.posts()
    assert posts == [], f"{what}: the phone was sent {len(posts)} request(s): {posts}"
    assert phone_counters(p) == before, f"{what}: the phone's token counters moved"
    assert gw.alive(), f"{what}: the gateway died"


def assert_still_serves(gw, p, tap, before, what):
    """A normal request on a fresh connection is served, and does reach the phone (so the
    tap and the counters would have seen a case that got through)."""
    check_chat_ok(chat(gw, "still here?", max_tokens=2, timeout=T(10)))
    assert len(tap.posts()) == 1, f"{what}: tap saw {tap.posts()} for one normal request"
    assert phone_counters(p) != before, f"{what}: the normal request left no trace on the phone"


# ---------------------------------------------------------------------------- the cases

def body_of(content="smuggled", **extra):
    b = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    b.update(extra)
    return json.dumps(b).encode()


BODY = body_of()
SMUGGLED = (f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(BODY)}\r\n\r\n").encode() + BODY


def head(lines, method="POST", target=CHAT, version="HTTP/1.1", eol=b"\r\n"):
    """A request head from header lines given as bytes or str, joined with eol."""
    parts = [f"{method} {target} {version}".encode()]
    parts += [ln if isinstance(ln, bytes) else ln.encode() for ln in lines]
    return eol.join(parts) + eol + eol


def chunked(data, size_fmt="{:x}", ext=b""):
    return size_fmt.format(len(data)).encode() + ext + b"\r\n" + data + b"\r\n0\r\n\r\n"


CT = "Content-Type: application/json"
CL = f"Content-Length: {len(BODY)}"
TE = "Transfer-Encoding: chunked"


class Case:
    """One hostile request. expect: the statuses allowed; close: the connection must be
    closed after the answer (ambiguous framing); body_shape: an OpenAI error body is
    required when a body is sent."""

    def __init__(self, id, data, expect=(400,), close=True, note=""):
        self.id = id
        self.data = data if isinstance(data, bytes) else data.encode()
        self.expect = set(expect)
        self.close = close
        self.note = note


def deep_json(n):
    return (b'{"model":"' + MODEL.encode() + b'","messages":[{"role":"user","content":"x"}],'
            b'"x":' + b"[" * n + b"]" * n + b"}")


def huge_array_json(n):
    return (b'{"model":"' + MODEL.encode() + b'","messages":[{"role":"user","content":"x"}],'
            b'"max_tokens":2,"x":[' + b",".join([b"0"] * n) + b"]}")


def many_messages_json(n):
    m = b'{"role":"user","content":""}'
    return (b'{"model":"' + MODEL.encode() + b'","max_tokens":2,"messages":[' +
            b",".join([m] * n) + b"]}")


def post_json(raw_body, extra=()):
    return head([HOST_H, CT, f"Content-Length: {len(raw_body)}", *extra]) + raw_body


HOST_H = "Host: gw"

CASES = [
    # --- CL.TE / TE.CL: both framings at once (RFC 9112 6.3: reject or close)
    Case("cl_te", head([HOST_H, CT, CL, TE]) + chunked(BODY) + SMUGGLED),
    Case("te_cl", head([HOST_H, CT, TE, "Content-Length: 4"]) + chunked(BODY) + SMUGGLED),
    Case("te_cl_classic", head([HOST_H, CT, "Content-Length: 3", TE]) +
         b"8\r\nSMUGGLED\r\n0\r\n\r\n" + SMUGGLED),
    # --- TE.TE obfuscations
    Case("te_xchunked", head([HOST_H, CT, "Transfer-Encoding: xchunked", CL]) + BODY),
    Case("te_chunked_identity", head([HOST_H, CT, "Transfer-Encoding: chunked, identity"]) +
         chunked(BODY)),
    Case("te_identity_only", head([HOST_H, CT, "Transfer-Encoding: identity", CL]) + BODY),
    Case("te_two_headers", head([HOST_H, CT, TE, "Transfer-Encoding: x"]) + chunked(BODY)),
    Case("te_space_before_colon", head([HOST_H, CT, "Transfer-Encoding : chunked"]) +
         chunked(BODY)),
    Case("te_tab_before_colon", head([HOST_H, CT, "Transfer-Encoding\t: chunked"]) +
         chunked(BODY)),
    Case("te_vertical_tab", head([HOST_H, CT, b"Transfer-Encoding: \x0bchunked"]) +
         chunked(BODY)),
    Case("te_obs_fold", head([HOST_H, CT, "Transfer-Encoding:", " chunked"]) + chunked(BODY)),
    Case("te_http10", head([HOST_H, CT, TE, CL], version="HTTP/1.0") + chunked(BODY)),
    # --- Content-Length
    Case("cl_duplicate_same", head([HOST_H, CT, CL, CL]) + BODY),
    Case("cl_conflicting", head([HOST_H, CT, CL, "Content-Length: 3"]) + BODY),
    Case("cl_list", head([HOST_H, CT, f"Content-Length: {len(BODY)}, {len(BODY)}"]) + BODY),
    Case("cl_plus_sign", head([HOST_H, CT, f"Content-Length: +{len(BODY)}"]) + BODY),
    Case("cl_negative", head([HOST_H, CT, "Content-Length: -1"]) + BODY),
    Case("cl_hex", head([HOST_H, CT, f"Content-Length: 0x{len(BODY):x}"]) + BODY),
    Case("cl_inner_space", head([HOST_H, CT, f"Content-Length: {len(BODY)} 0"]) + BODY),
    Case("cl_empty", head([HOST_H, CT, "Content-Length:"]) + BODY),
    Case("cl_overflow", head([HOST_H, CT, "Content-Length: 184467440737095516160"]) + BODY,
         expect=(400, 413)),
    # --- chunk sizes and extensions
    Case("chunk_size_overflow", head([HOST_H, CT, TE]) +
         b"1" + b"0" * 17 + b"\r\n" + BODY + b"\r\n0\r\n\r\n", expect=(400, 413)),
    Case("chunk_size_negative", head([HOST_H, CT, TE]) + b"-5\r\nhello\r\n0\r\n\r\n"),
    Case("chunk_size_0x", head([HOST_H, CT, TE]) + chunked(BODY, size_fmt="0x{:x}")),
    Case("chunk_size_space", head([HOST_H, CT, TE]) + chunked(BODY, size_fmt="{:x} ")),
    Case("chunk_size_not_hex", head([HOST_H, CT, TE]) + b"zz\r\n" + BODY + b"\r\n0\r\n\r\n"),
    Case("chunk_missing_crlf", head([HOST_H, CT, TE]) +
         f"{len(BODY):x}\r\n".encode() + BODY + b"XX0\r\n\r\n"),
    Case("chunk_size_bare_lf", head([HOST_H, CT, TE]) +
         f"{len(BODY):x}\n".encode() + BODY + b"\n0\n\n"),
    Case("chunk_ext_huge", head([HOST_H, CT, TE]) +
         chunked(BODY, ext=b";e=" + b"a" * (1 << 20)), expect=(400, 413)),
    Case("chunk_ext_bare_lf", head([HOST_H, CT, TE]) +
         chunked(BODY, ext=b';e="a\nb"')),
    # --- line endings and header syntax
    Case("bare_lf_everywhere", head([HOST_H, CT, CL], eol=b"\n") + BODY),
    Case("bare_lf_headers", f"POST {CHAT} HTTP/1.1\r\n".encode() +
         f"{HOST_H}\n{CT}\n{CL}\n\r\n".encode() + BODY),
    Case("bare_cr_line_end", f"POST {CHAT} HTTP/1.1\r\n{HOST_H}\r{CT}\r\n{CL}\r\n\r\n".encode() +
         BODY),
    Case("bare_cr_in_value", head([HOST_H, CT, CL, b"X-A: a\rb"]) + BODY),
    Case("obs_fold", head([HOST_H, CT, CL, "X-Folded: a", " b"]) + BODY),
    Case("nul_in_value", head([HOST_H, CT, CL, b"X-A: a\x00b"]) + BODY),
    Case("nul_in_name", head([HOST_H, CT, CL, b"X-\x00A: b"]) + BODY),
    Case("space_in_name", head([HOST_H, CT, CL, "X Foo: b"]) + BODY),
    Case("bad_name_chars", head([HOST_H, CT, CL, "X(Foo): b"]) + BODY),
    Case("non_ascii_name", head([HOST_H, CT, CL, b"X-\xc3\xa9: b"]) + BODY),
    Case("no_colon", head([HOST_H, CT, CL, "JustAWord"]) + BODY),
    Case("empty_name", head([HOST_H, CT, CL, ": value"]) + BODY),
    Case("missing_host", head([CT, CL]) + BODY),
    Case("duplicate_host", head([HOST_H, "Host: other", CT, CL]) + BODY),
    # --- request line
    Case("tab_request_line", f"POST\t{CHAT}\tHTTP/1.1\r\n{HOST_H}\r\n{CT}\r\n"
         f"{CL}\r\n\r\n".encode() + BODY),
    Case("extra_token_request_line", head([HOST_H, CT, CL], version="HTTP/1.1 x") + BODY),
    Case("lowercase_version", head([HOST_H, CT, CL], version="http/1.1") + BODY),
    Case("version_1_9", head([HOST_H, CT, CL], version="HTTP/1.9") + BODY,
         expect=(400, 505)),
    Case("version_2_in_line", head([HOST_H, CT, CL], version="HTTP/2.0") + BODY,
         expect=(400, 505)),
    Case("unknown_method", head([HOST_H, CT, CL], method="FOO") + BODY,
         expect=(400, 405, 501)),
    Case("nul_in_method", head([HOST_H, CT, CL], method="PO\x00ST") + BODY),
    Case("ctl_in_target", head([HOST_H, CT, CL], target="/v1/chat\x01/completions") + BODY),
    Case("absolute_form_foreign", head([HOST_H, CT, CL], target="http://evil.example" + CHAT)
         + BODY, expect=(400, 404), close=False),
    Case("asterisk_form_post", head([HOST_H, CT, CL], target="*") + BODY,
         expect=(400, 404), close=False),
    Case("dot_segments", head([HOST_H, CT, CL], target="/v1/x/../chat/completions") + BODY,
         expect=(400, 404), close=False),
    Case("connect_method", "CONNECT phone.example:443 HTTP/1.1\r\nHost: phone.example:443"
         "\r\n\r\n", expect=(400, 404, 405), close=False),
    Case("http09", f"GET {CHAT}\r\n", expect=(400, 408, None),
         note="llhttp waits for a version: cut off by the header timeout (408) at worst"),
    Case("http2_preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00" * 9,
         expect=(400, 505)),
    Case("tls_on_plain_port", bytes.fromhex("160301002e0100002a0303") + b"\x00" * 40),
    # --- sizes
    Case("header_too_large", head([HOST_H, CT, CL, "X-Big: " + "b" * 40000]) + BODY,
         expect=(431,)),
    Case("too_many_headers", head([HOST_H, CT, CL] + [f"X-H{i}: v" for i in range(300)]) + BODY,
         expect=(431,)),
    Case("target_too_long", head([HOST_H, CT, CL], target=CHAT + "?" + "q" * 40000) + BODY,
         expect=(414, 431)),
    Case("body_too_large_cl", head([HOST_H, CT, "Content-Length: 104857600"]), expect=(413,)),
    Case("body_too_large_chunked", head([HOST_H, CT, TE]) +
         b"".join(b"100000\r\n" + b" " * 0x100000 + b"\r\n" for _ in range(5)) + b"0\r\n\r\n",
         expect=(413,)),
    # --- hostile JSON (well framed: the connection may stay open)
    Case("utf8_invalid_byte", post_json(BODY.replace(b"smuggled", b"smug\xffgled")),
         close=False),
    Case("utf8_overlong", post_json(BODY.replace(b"smuggled", b"smug\xc0\xafgled")),
         close=False),
    Case("utf8_surrogate", post_json(BODY.replace(b"smuggled", b"smug\xed\xa0\x80gled")),
         close=False),
    Case("utf8_truncated", post_json(BODY.replace(b"smuggled\"", b"smuggled\xe2\x82\"")),
         close=False),
    Case("utf8_above_max", post_json(BODY.replace(b"smuggled", b"smug\xf4\x90\x80\x80gled")),
         close=False),
    Case("utf8_in_key", post_json(BODY.replace(b'"max_tokens"', b'"\xfe\xff": 1, "max_tokens"')),
         close=False),
    Case("json_raw_control_char", post_json(BODY.replace(b"smuggled", b"smug\x01gled")),
         close=False),
    Case("json_raw_nul", post_json(BODY.replace(b"smuggled", b"smug\x00gled")),
         close=False),
    Case("json_lone_surrogate_escape", post_json(BODY.replace(b"smuggled", b"smug\\ud800gled")),
         close=False),
    Case("json_deep_nesting", post_json(deep_json(100000)), close=False),
    Case("json_nesting_65", post_json(deep_json(65)), close=False),
    Case("json_huge_array", post_json(huge_array_json(1 << 20)), close=False),
    Case("json_many_messages", post_json(many_messages_json(100000)), close=False),
    Case("json_two_documents", post_json(BODY + BODY), close=False),
    Case("json_duplicate_model", post_json(BODY.replace(b'{"model"',
                                                        b'{"model": "other", "model"')),
         close=False),
]

assert len(CASES) >= 25 and len({c.id for c in CASES}) == len(CASES)


def send_case(port, case):
    """Send the case's bytes (the server may answer and close before all are taken), read
    the first answer. Returns (status or None, headers, body, RawConn)."""
    c = g.RawConn(port, timeout=T(10))
    try:
        c.sock.sendall(case.data)
    except OSError:
        pass  # answered and closed early: the answer is read below
    try:
        status, headers, body = c.read_response(timeout=T(8))
    except EOFError:
        status, headers, body = None, {}, b""
    return status, headers, body, c


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_request_is_refused_and_reaches_no_phone(guarded, case):
    gw, p, tap = guarded
    before = phone_counters(p)
    status, headers, body, c = send_case(gw.port, case)
    try:
        assert status in case.expect, \
            f"{case.id}: status {status}, wanted {sorted(case.expect, key=str)}: {body[:300]!r}"
        if status is not None and body:
            assert headers.get("content-type", "").startswith("application/json"), headers
            g.check_error_body(body, status, what=case.id)
        if case.close:
            # framing in doubt: nothing after the answer may be read as a request
            assert status is None or headers.get("connection", "").lower() == "close", \
                f"{case.id}: the answer does not say Connection: close: {headers}"
            assert c.wait_closed(T(4)), f"{case.id}: the connection stayed open"
            assert c.buf == b"", f"{case.id}: more bytes after the answer: {c.buf[:300]!r}"
    finally:
        c.close()
    assert_nothing_reached(gw, p, tap, before, case.id)
    assert_still_serves(gw, p, tap, before, case.id)


# ---------------------------------------------------------------------------- not refused,
# but never misread: valid if odd framing must be read exactly as RFC 9112 says.

def test_leading_zero_content_length_is_decimal(guarded):
    """Content-Length = 1*DIGIT, so "010" is ten: a parser that read it as octal (eight)
    would take the last two body bytes as the start of a second request."""
    gw, p, tap = guarded
    before = phone_counters(p)
    bad = b'{"a":1}  x'  # ten bytes, not JSON the gateway accepts
    data = head([HOST_H, CT, "Content-Length: 010"]) + bad + \
        g.request_bytes("GET", "/healthz", gw.port)
    c = g.RawConn(gw.port)
    try:
        c.send(data)
        s1, _, b1 = c.read_response(timeout=T(5))
        s2, _, b2 = c.read_response(timeout=T(5))
    finally:
        c.close()
    assert s1 == 400, (s1, b1[:200])
    assert s2 == 200 and json.loads(b2)["status"] == "ok", (s2, b2[:200])
    assert_nothing_reached(gw, p, tap, before, "leading zeros")


def test_bytes_after_connection_close_are_never_read(guarded):
    """RFC 9112 9.6: after a request with Connection: close the server reads no further
    request on that connection, however well formed."""
    gw, p, tap = guarded
    before = phone_counters(p)
    for first in (g.request_bytes("GET", "/healthz", gw.port, headers={"Connection": "close"}),
                  b"GET /healthz HTTP/1.0\r\nHost: gw\r\n\r\n"):
        c = g.RawConn(gw.port)
        try:
            c.send(first + SMUGGLED)
            status, headers, _ = c.read_response(timeout=T(5))
            assert status == 200
            assert c.wait_closed(T(4)), "the connection stayed open after Connection: close"
            assert c.buf == b"", f"a second answer came: {c.buf[:200]!r}"
        finally:
            c.close()
    assert_nothing_reached(gw, p, tap, before, "after close")
    assert_still_serves(gw, p, tap, before, "after close")


def test_upgrade_is_never_switched(guarded):
    """h2c / websocket upgrades are answered as plain HTTP/1.1 (no 101 for a smuggler to
    tunnel through), and what follows is parsed as HTTP/1.1 again."""
    gw, p, tap = guarded
    c = g.RawConn(gw.port)
    try:
        c.send(g.request_bytes("GET", "/healthz", gw.port,
                               headers={"Connection": "Upgrade, HTTP2-Settings",
                                        "Upgrade": "h2c", "HTTP2-Settings": "AAMAAABkAARAAAAAAAIAAAAA"}))
        status, _, body = c.read_response(timeout=T(5))
        assert status == 200, (status, body[:200])
        c.send(g.request_bytes("GET", "/healthz", gw.port,
                               headers={"Connection": "Upgrade", "Upgrade": "websocket",
                                        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                                        "Sec-WebSocket-Version": "13"}))
        status, _, body = c.read_response(timeout=T(5))
        assert status == 200, (status, body[:200])
    finally:
        c.close()


def test_large_but_legitimate_json_is_served(guarded):
    """The JSON limits leave room for real work: 2,000 messages and a 1 MiB prompt."""
    gw, p, tap = guarded
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"}
            for i in range(2000)]
    r = gw.post(CHAT, json={"model": MODEL, "messages": msgs, "max_tokens": 2}, timeout=T(20))
    assert r.status_code in (200, 400), r.text[:300]
    if r.status_code == 400:  # too long for the sim's context: said so, not "too complex"
        assert "complex" not in r.text and "too many" not in r.text, r.text[:300]
    big = "é" * (1 << 19)  # 1 MiB of two-byte UTF-8
    r = gw.post(CHAT, json={"model": MODEL, "messages": [{"role": "user", "content": big}],
                            "max_tokens": 2}, timeout=T(20))
    assert r.status_code != 413 and "utf" not in r.text.lower(), r.text[:300]


# ---------------------------------------------------------------------------- slow clients

@pytest.fixture
def slow_front(sim, gateway):
    """header_timeout_s 1: headers must arrive within 1 s, a body within 6 s."""
    p = phone(sim, "slowfront", slots=4)
    gw = g.start_gateway(gateway, [replica(p)],
                         limits={"header_timeout_s": 1, "idle_timeout_s": 10,
                                 "max_body_bytes": 1 << 20})
    return gw, p


class Dribbler(threading.Thread):
    """Sends `first`, then one byte of `rest` every `gap` seconds until the server closes
    the connection, `stop` is set, or `rest` runs out. Records when the close was seen."""

    def __init__(self, port, first, rest, gap, stop):
        super().__init__(daemon=True)
        self.c = g.RawConn(port, timeout=T(30))
        self.first, self.rest, self.gap, self.stop = first, rest, gap, stop
        self.t0 = time.monotonic()
        self.closed_after = None

    def run(self):
        try:
            self.c.send(self.first)
            for i in range(len(self.rest) + 1):
                # wait one gap, watching for the server's answer or its FIN meanwhile
                end = time.monotonic() + self.gap
                while not self.stop.is_set():
                    left = end - time.monotonic()
                    if left <= 0:
                        break
                    r, _, _ = select.select([self.c.sock], [], [], min(left, 0.05))
                    if r:
                        b = self.c.sock.recv(65536)
                        if not b:
                            self.closed_after = time.monotonic() - self.t0
                            return
                        self.c.buf += b
                if self.stop.is_set() or i == len(self.rest):
                    return
                self.c.sock.sendall(self.rest[i:i + 1])
        except OSError:
            if self.closed_after is None:
                self.closed_after = time.monotonic() - self.t0

    def finish(self):
        self.stop.set()
        self.join(timeout=T(20))
        self.c.close()


def serve_meanwhile(gw, seconds):
    """Chat requests one after another for `seconds`: every one must be answered quickly."""
    n, worst = 0, 0.0
    end = time.monotonic() + seconds
    for _ in range(1000):
        if time.monotonic() >= end:
            break
        t = time.monotonic()
        check_chat_ok(chat(gw, f"normal {n}", max_tokens=2, timeout=T(5)))
        worst = max(worst, time.monotonic() - t)
        n += 1
        time.sleep(0.05)
    return n, worst


def test_slow_headers_and_slow_bodies_are_cut_off_while_others_are_served(slow_front):
    gw, p = slow_front
    stop = threading.Event()
    body = body_of("slow body")
    head_bytes = head([HOST_H, CT, f"Content-Length: {len(body)}"])
    # 30 slowloris connections (headers one byte every 0.2 s), 10 slow bodies (one byte
    # every 0.5 s after complete headers), 10 slow chunked bodies
    lorises = [Dribbler(gw.port, head_bytes[:10], head_bytes[10:], 0.2, stop) for _ in range(30)]
    bodies = [Dribbler(gw.port, head_bytes, body, 0.5, stop) for _ in range(10)]
    chunky = [Dribbler(gw.port, head([HOST_H, CT, TE]), chunked(body), 0.5, stop)
              for _ in range(10)]
    everyone = lorises + bodies + chunky
    for d in everyone:
        d.start()
    try:
        n, worst = serve_meanwhile(gw, 8)
        assert n >= 10 and worst < T(2), f"normal client: {n} answers, slowest {worst:.2f} s"
        for d in everyone:
            d.join(timeout=T(12))
        for d in lorises:
            assert d.closed_after is not None, "a slowloris connection was never closed"
            assert 0.8 <= d.closed_after <= T(3), \
                f"slow headers closed after {d.closed_after:.2f} s (header_timeout_s 1)"
            if d.c.buf:
                assert fleet.http_status(d.c.buf) == 408, d.c.buf[:200]
        for d in bodies + chunky:
            assert d.closed_after is not None, "a slow body connection was never closed"
            assert 5.5 <= d.closed_after <= T(9), \
                f"slow body closed after {d.closed_after:.2f} s (6 x header_timeout_s 1)"
            if d.c.buf:
                assert fleet.http_status(d.c.buf) == 408, d.c.buf[:200]
                g.check_error_body(d.c.buf.split(b"\r\n\r\n", 1)[1], 408, what="408")
    finally:
        for d in everyone:
            d.finish()
    # none of the slow requests reached the phone: it served only the normal ones
    m = p.metrics(timeout=T(3))
    assert m["llamacpp:tokens_predicted_total"] == 2 * n, m["llamacpp:tokens_predicted_total"]


def test_idle_connections_that_never_speak_are_closed(slow_front):
    gw, _ = slow_front
    socks = [socket.create_connection((HOST, gw.port), timeout=T(10)) for _ in range(50)]
    try:
        t0 = time.monotonic()
        check_chat_ok(chat(gw, "busy?", max_tokens=2, timeout=T(5)))
        for s in socks:
            s.settimeout(max(0.1, t0 + T(4) - time.monotonic()))
            try:
                got = s.recv(4096)
            except socket.timeout:
                raise AssertionError("a silent connection outlived header_timeout_s") from None
            except OSError:
                got = b""  # reset: closed too
            assert got == b"", f"a silent connection was sent {got[:100]!r}"
        assert time.monotonic() - t0 <= T(4)
    finally:
        for s in socks:
            s.close()
