"""Helpers for the gateway's system tests (test_gateway.py), on top of fleet.py: a gateway
config built from started sims, the gateway's JSON log, OpenAI error bodies, a background
watcher of the sims' /metrics, and a raw HTTP/1.1 client for what requests cannot do
(pipelining, 100-continue, chunked bodies, slow headers)."""

import json
import re
import socket
import threading
import time
from pathlib import Path

import fleet
from fleet import HOST, T

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MODEL = "sim-model"

# Sims run this many times faster than real time unless a test says otherwise. The sim
# reports wall-clock timings, so the gateway is told rates multiplied by the scale.
SCALE = 10


# ---------------------------------------------------------------------------- fleet set-up

def phone(sim, id, slots=1, prefill_tps=200, decode_tps=10, scale=SCALE, model=MODEL,
          fault_plan=None, **kw):
    """Start a sim phone named id. prefill_tps/decode_tps are the sim's (simulated) rates;
    d.real_prefill / d.real_decode are the wall-clock rates the gateway should expect."""
    d = sim(model=model, slots=slots, prefill_tps=prefill_tps, decode_tps=decode_tps,
            time_scale=scale, fault_plan=fault_plan, id=id, name=id, **kw)
    d.id = id
    d.real_prefill = prefill_tps * scale
    d.real_decode = decode_tps * scale
    return d


def replica(d, models=None, **over):
    """The gateway's replica entry for sim d (its id, URL, slots and wall-clock rates)."""
    r = {"id": d.id, "url": d.url, "models": models or [d.model], "slots": d.slots,
         "prefill_tps": d.real_prefill, "decode_tps": d.real_decode}
    r.update(over)
    return r


def gw_config(port, replicas, limits=None, queue=None, scheduler=None, upstream=None,
              health=None, **top):
    """A gateway config listening on 127.0.0.1:port. Sections merge over test defaults
    that keep failures quick to detect."""
    cfg = {
        "listen": [{"address": f"{HOST}:{port}"}],
        "limits": {"header_timeout_s": 5, "idle_timeout_s": 30},
        "queue": {"max": 1000, "timeout_s": 60},
        "scheduler": {"retries": 3, "default_max_tokens": 64, "expected_output_tokens": 8},
        "upstream": dict(fleet.ALLOW_LOOPBACK, connect_timeout_s=2, timeout_margin=3,
                         timeout_min_s=5, stream_idle_timeout_s=10),
        "health": {"interval_s": 0.5, "timeout_s": 1, "rise": 1, "fall": 2,
                   "cooldown_s": 5, "cooldown_max_s": 30,
                   "readyz_counts": True},  # replicas_ready() reads them
        "shutdown_timeout_s": 10,
        "log_level": "info",
        "replicas": replicas,
    }
    for name, sec in (("limits", limits), ("queue", queue), ("scheduler", scheduler),
                      ("upstream", upstream), ("health", health)):
        if sec:
            cfg[name].update(sec)
    cfg.update(top)
    return cfg


def replicas_ready(d):
    """How many replicas d's /readyz counts as ready (None if it does not answer)."""
    import requests  # noqa: PLC0415
    try:
        return requests.get(d.url + "/readyz", timeout=1).json().get("replicas_ready")
    except (requests.RequestException, ValueError):
        return None


def start_gateway(gateway, replicas, ready=None, **kw):
    """fleetgate in front of replicas (entries from replica()); kw as gw_config(). Ready
    once /readyz counts `ready` replicas ready (default: all not drained; 0: don't wait)."""
    if ready is None:
        ready = sum(1 for r in replicas if not r.get("drain"))
    check = (lambda d: (replicas_ready(d) or 0) >= ready) if ready else None
    return gateway(lambda ports: gw_config(ports[0], replicas, **kw), ready=check)


def chat(d, content="Hello", model=MODEL, max_tokens=8, headers=None, timeout=None,
         stream=False, **kw):
    """POST a chat completion to d (a requests.Response)."""
    body = fleet.chat_body(content, model=model, max_tokens=max_tokens, stream=stream)
    body.update(kw)
    return d.post(CHAT, json=body, headers=headers, timeout=timeout, stream=stream)


def check_chat_ok(r, want_replica=None):
    """A 200 chat completion, valid, served by the replica its headers name. Returns the body."""
    assert r.status_code == 200, (r.status_code, r.text[:500])
    assert r.headers.get("Content-Type", "").startswith("application/json"), r.headers
    body = r.json()
    assert body["object"] == "chat.completion", body
    assert body["choices"] and body["choices"][0]["message"]["role"] == "assistant", body
    assert isinstance(body["choices"][0]["message"]["content"], str), body
    assert body["usage"]["completion_tokens"] >= 1, body
    rid = r.headers.get("x-request-id")
    assert rid, f"no x-request-id: {dict(r.headers)}"
    rep = r.headers.get("x-fleetgate-replica")
    assert rep, f"no x-fleetgate-replica: {dict(r.headers)}"
    assert rep == body.get("system_fingerprint"), (rep, body.get("system_fingerprint"))
    if want_replica is not None:
        assert rep == want_replica, (rep, want_replica)
    return body


# ---------------------------------------------------------------------------- errors

ERROR_KEYS = {"message", "type", "param", "code"}


def check_error_body(body_text, status, code=None, what=""):
    """An OpenAI-shaped error body: {"error":{"message","type","param","code"}}.
    Returns the inner error object."""
    try:
        body = json.loads(body_text)
    except ValueError:
        raise AssertionError(f"{what} {status}: error body is not JSON: {body_text[:300]!r}")
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), \
        f"{what} {status}: not an OpenAI error body: {body_text[:300]}"
    e = body["error"]
    missing = ERROR_KEYS - set(e)
    assert not missing, f"{what} {status}: error lacks {sorted(missing)}: {body_text[:300]}"
    assert isinstance(e["message"], str) and e["message"], e
    assert isinstance(e["type"], str) and e["type"], e
    assert e["param"] is None or isinstance(e["param"], str), e
    assert e["code"] is None or isinstance(e["code"], (str, int)), e
    if code is not None:
        assert e["code"] == code, f"{what}: code {e['code']!r}, wanted {code!r}: {e}"
    return e


def check_error(r, status, code=None, retry_after=False, what=""):
    """requests.Response r is an OpenAI error with this status (and Retry-After when
    asked: an integer number of seconds >= 1). Returns the inner error object."""
    assert r.status_code == status, \
        f"{what}: status {r.status_code}, wanted {status}: {r.text[:300]}"
    assert r.headers.get("Content-Type", "").startswith("application/json"), \
        f"{what}: Content-Type {r.headers.get('Content-Type')!r}"
    assert r.headers.get("x-request-id"), f"{what} {status}: no x-request-id: {dict(r.headers)}"
    if retry_after:
        ra = r.headers.get("Retry-After")
        assert ra is not None and re.fullmatch(r"\d+", ra) and int(ra) >= 1, \
            f"{what} {status}: Retry-After {ra!r}: {dict(r.headers)}"
    return check_error_body(r.text, status, code, what)


# ---------------------------------------------------------------------------- the JSON log

def log_records(d):
    """Every JSON line of d's stderr, parsed (other lines skipped)."""
    out = []
    try:
        text = Path(d.stderr_path).read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def log_msgs(d, msg, **match):
    """Log records with this msg whose fields equal match."""
    return [r for r in log_records(d)
            if r.get("msg") == msg and all(r.get(k) == v for k, v in match.items())]


def access_log(d, request_id):
    """The one access-log ("request") line of a request id, waited for briefly (the line
    is written when the job ends, which may be just after the client got its answer)."""
    got = fleet.wait_until(lambda: log_msgs(d, "request", request_id=request_id), T(3))
    assert got, f"no access-log line for {request_id}"
    assert len(got) == 1, f"{len(got)} access-log lines for {request_id}: {got}"
    return got[0]


# ---------------------------------------------------------------------------- sims' /metrics

def sim_gauges(d, timeout=2.0):
    """(requests_processing, requests_deferred) of a sim, from its /metrics."""
    m = d.metrics(timeout=timeout)
    return int(m["llamacpp:requests_processing"]), int(m["llamacpp:requests_deferred"])


class MetricsWatch:
    """Polls each sim's /metrics in a background thread until stop(): the most requests
    each ever had processing and deferred. Use as a context manager."""

    def __init__(self, sims, interval=0.01):
        self.sims = list(sims)
        self.interval = interval
        self.max_processing = {d.id: 0 for d in self.sims}
        self.max_deferred = {d.id: 0 for d in self.sims}
        self.samples = 0
        self.errors = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        import requests  # noqa: PLC0415 - per thread session
        sess = requests.Session()
        while not self._stop.is_set():
            for d in self.sims:
                try:
                    r = sess.get(d.url + "/metrics", timeout=2)
                    m = fleet.parse_prometheus(r.text)
                    p = int(m["llamacpp:requests_processing"])
                    q = int(m["llamacpp:requests_deferred"])
                except Exception as e:  # noqa: BLE001 - a killed sim, reported by the test
                    if len(self.errors) < 50:
                        self.errors.append(f"{d.id}: {e!r}")
                    continue
                self.max_processing[d.id] = max(self.max_processing[d.id], p)
                self.max_deferred[d.id] = max(self.max_deferred[d.id], q)
            self.samples += 1
            self._stop.wait(self.interval)
        sess.close()

    def __enter__(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=10)

    def __exit__(self, *exc):
        self.stop()


# ---------------------------------------------------------------------------- raw HTTP/1.1

class RawConn:
    """One TCP connection to the gateway, spoken to byte by byte, with a reader that
    splits the bytes received into HTTP responses (Content-Length or chunked bodies, 1xx
    interim responses kept apart)."""

    def __init__(self, port, timeout=10.0, rcvbuf=None):
        self.port = port
        if rcvbuf:  # set before connecting, so the window is negotiated with it
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            self.sock.settimeout(timeout)
            self.sock.connect((HOST, port))
        else:
            self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.buf = b""
        self.closed = False

    def send(self, data):
        self.sock.sendall(data if isinstance(data, bytes) else data.encode())

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def _fill(self, deadline):
        if self.closed:
            return False
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no more bytes before the deadline")
        self.sock.settimeout(left)
        try:
            b = self.sock.recv(65536)
        except socket.timeout:
            raise TimeoutError("no more bytes before the deadline") from None
        except ConnectionResetError:
            b = b""
        if not b:
            self.closed = True
            return False
        self.buf += b
        return True

    def _line(self, deadline):
        while b"\r\n" not in self.buf:
            if not self._fill(deadline):
                raise EOFError(f"connection closed mid-line: {self.buf[:200]!r}")
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def _exact(self, n, deadline):
        while len(self.buf) < n:
            if not self._fill(deadline):
                raise EOFError(f"connection closed with {len(self.buf)} of {n} bytes")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_response(self, timeout=10.0, head_only=False):
        """The next response: (status, headers with lower-case names, body bytes).
        Raises EOFError when the server closed first, TimeoutError after timeout s."""
        deadline = time.monotonic() + timeout
        while not self.buf and not self.closed:
            if not self._fill(deadline):
                break
        if not self.buf and self.closed:
            raise EOFError("connection closed before a response")
        status_line = self._line(deadline).decode("latin-1")
        m = re.match(r"HTTP/1\.[01] (\d{3})", status_line)
        if not m:
            raise AssertionError(f"not a status line: {status_line!r}")
        status = int(m.group(1))
        headers = {}
        while True:
            line = self._line(deadline).decode("latin-1")
            if not line:
                break
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        if 100 <= status < 200 or head_only:
            return status, headers, b""
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self._line(deadline).split(b";")[0], 16)
                if size == 0:
                    while self._line(deadline):  # trailers
                        pass
                    break
                body += self._exact(size, deadline)
                self._line(deadline)
            return status, headers, body
        n = int(headers.get("content-length", "0"))
        return status, headers, self._exact(n, deadline)

    def read_until(self, needle, timeout):
        """True once needle is among the bytes received (kept in buf) within timeout s."""
        deadline = time.monotonic() + timeout
        try:
            while needle not in self.buf:
                if not self._fill(deadline):
                    return False
        except TimeoutError:
            return False
        return True

    def wait_closed(self, timeout):
        """True when the server closes the connection within timeout seconds (bytes that
        arrive meanwhile are kept in buf)."""
        deadline = time.monotonic() + timeout
        try:
            while self._fill(deadline):
                pass
        except TimeoutError:
            return False
        except OSError:
            self.closed = True
        return self.closed


def request_bytes(method, path, port, body=None, headers=None):
    return fleet.http_request_bytes(method, path, body=body, headers=headers, port=port)


def chat_bytes(port, content="Hello", model=MODEL, max_tokens=8, headers=None, **kw):
    body = fleet.chat_body(content, model=model, max_tokens=max_tokens)
    body.update(kw)
    return request_bytes("POST", CHAT, port, body=body, headers=headers)


def open_chat(port, content="Hello", model=MODEL, max_tokens=8, headers=None, **kw):
    """Send a chat request on a fresh raw connection and return the connection, the
    answer unread: the caller reads it or closes the connection (a client that leaves)."""
    c = RawConn(port)
    c.send(chat_bytes(port, content, model, max_tokens, headers, **kw))
    return c


# ---------------------------------------------------------------------------- scripted phones

class ScriptedPhone:
    """A replica that answers completions as a test scripts them (HAProxy's vtest idea):
    answer(body_dict, n) returns (status, body) for a whole answer — body bytes, str or a
    JSON-able object — or ("stream", [events...]) for a 200 event stream, where an event is
    a JSON-able object, a str sent as it is after "data: ", or a float: seconds to sleep.
    A whole answer may be delayed: (status, body, delay_s). GET /health answers 200 and
    every other path 404 (so the gateway learns nothing from /props). n counts the
    completion requests this phone got, from 1. Runs in a thread on a free port."""

    def __init__(self, answer, id="scripted"):
        import http.server  # noqa: PLC0415
        import socketserver  # noqa: PLC0415
        phone = self
        self.answer = answer
        self.id = id
        self.requests = []
        self._lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def _send(self, status, body, ctype="application/json"):
                if not isinstance(body, (bytes, str)):
                    body = json.dumps(body)
                if isinstance(body, str):
                    body = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802
                if self.path == "/health":
                    self._send(200, {"status": "ok"})
                else:
                    self._send(404, {"error": {"code": 404, "message": "File Not Found",
                                               "type": "not_found_error"}})

            def do_POST(self):  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                with phone._lock:
                    phone.requests.append(body)
                    k = len(phone.requests)
                got = phone.answer(body, k)
                if got[0] == "stream":
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    try:
                        for ev in got[1]:
                            if isinstance(ev, float):
                                time.sleep(ev)
                                continue
                            data = ev if isinstance(ev, str) else json.dumps(ev)
                            chunk = f"data: {data}\n\n".encode()
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                            self.wfile.flush()
                        self.wfile.write(b"0\r\n\r\n")
                    except (BrokenPipeError, ConnectionResetError):
                        pass
                    return
                if len(got) > 2:
                    time.sleep(got[2])
                try:
                    self._send(got[0], got[1])
                except (BrokenPipeError, ConnectionResetError):
                    pass

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server((HOST, 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://{HOST}:{self.port}"
        self._t = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._t.start()

    @property
    def n(self):
        with self._lock:
            return len(self.requests)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def completion(content="ok", tokens=2, model=MODEL, id="chatcmpl-scripted"):
    """A whole chat completion as a phone answers it."""
    return {"id": id, "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": 5 + tokens}}


def chunk(delta, finish=None, id="chatcmpl-scripted"):
    """One streamed chat chunk."""
    return {"id": id, "object": "chat.completion.chunk", "created": 1, "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


# llama-server's refusals, as captured (tests/system/fixtures/error-*.http)
LLAMA_N2 = {"error": {"code": 500, "message": "Only one completion choice is allowed",
                      "type": "server_error"}}
LLAMA_TOOLS = {"error": {"code": 500, "message": "Failed to parse tools: [json.exception.out_of_range.403] "
                         "key 'description' not found; tools = []", "type": "server_error"}}
LLAMA_CONTEXT = {"error": {"code": 400, "message": "request (5028 tokens) exceeds the available context "
                           "size (2048 tokens), try increasing it", "type": "exceed_context_size_error",
                           "n_prompt_tokens": 5028, "n_ctx": 2048}}


# ---------------------------------------------------------------------------- phone identities

class PhoneKey:
    """A phone's Ed25519 identity key, as fleetgate-agent holds one (docs/protocol.md):
    `pub` is the base64 public key a heartbeat's `key` carries; `sign(ts, raw)` is its
    x-fleetgate-key-signature."""

    def __init__(self):
        import base64
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        self._b64 = base64
        self.private = Ed25519PrivateKey.generate()
        raw = self.private.public_key().public_bytes(serialization.Encoding.Raw,
                                                     serialization.PublicFormat.Raw)
        self.pub = base64.b64encode(raw).decode()

    def sign(self, ts, raw):
        return "ed25519=" + self._b64.b64encode(self.private.sign(ts.encode() + b"." + raw)).decode()

    def pem(self):
        from cryptography.hazmat.primitives import serialization
        return self.private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()).decode()


_PHONE_KEYS = {}


def phone_key(id):
    """The key a test phone named id signs with (one per id and test process)."""
    if id not in _PHONE_KEYS:
        _PHONE_KEYS[id] = PhoneKey()
    return _PHONE_KEYS[id]


def heartbeat_headers(body, secret=None, key=None, ts=None, sig=None, key_sig=None):
    """(raw body, headers) of a heartbeat: body (a dict) gets `key` unless it has one;
    signed by key (the id's phone_key by default) and, with a secret, the fleet's HMAC."""
    import hashlib
    import hmac
    key = key or phone_key(body["id"])
    if "key" not in body:
        body = dict(body, key=key.pub)
    raw = json.dumps(body).encode()
    ts = str(ts if ts is not None else int(time.time() * 1000))
    h = {"x-fleetgate-timestamp": ts, "Content-Type": "application/json",
         "x-fleetgate-key-signature": key_sig or key.sign(ts, raw)}
    if sig or secret:
        h["x-fleetgate-signature"] = sig or "sha256=" + hmac.new(
            secret.encode(), ts.encode() + b"." + raw, hashlib.sha256).hexdigest()
    return raw, h
