"""Attacks on the agent's front: a caller holding the replica token (or a gateway that was
taken over) tries to reach llama-server's other endpoints through the agent — /slots,
slot save/restore, /props — with traversal, percent escapes, doubled slashes, odd methods
and query strings. A scripted engine counts every request it is sent: none of these may
reach it, while the allow-listed calls (which the test also makes) do. And the agent
refuses to start with no token, an empty one, or one from an example."""
import json
import os
import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

import fleet
from fleet import HOST, T

TOKEN = "attack-test-replica-token-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class CountingEngine:
    """An OpenAI-compatible engine that answers everything and remembers every request
    line it was sent (method, target), so a test can say what reached it."""

    def __init__(self):
        self.seen = []
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _answer(self):
                n = int(self.headers.get("Content-Length", "0") or 0)
                if n:
                    self.rfile.read(n)
                with outer.lock:
                    outer.seen.append((self.command, self.path))
                if self.path == "/v1/models":
                    body = {"object": "list", "data": [{"id": "counted-model"}]}
                elif self.path == "/health":
                    body = {"status": "ok"}
                elif self.path in ("/v1/chat/completions", "/v1/completions"):
                    body = {"id": "x", "object": "chat.completion", "model": "counted-model",
                            "choices": [{"index": 0, "finish_reason": "stop",
                                         "message": {"role": "assistant", "content": "hi"}}],
                            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
                else:  # what llama-server's /slots, /props... would give away
                    body = {"secret": "engine internals"}
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _answer

        self.server = ThreadingHTTPServer((HOST, 0), H)
        self.url = f"http://{HOST}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def requests_seen(self, besides_probes=True):
        """What the engine was sent, less the agent's own readiness probes."""
        with self.lock:
            seen = list(self.seen)
        if besides_probes:
            seen = [s for s in seen if s not in (("GET", "/health"), ("GET", "/v1/models"), ("GET", "/props"))]
        return seen

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def engine():
    e = CountingEngine()
    yield e
    e.close()


def start_agent(procs, engine_url, token=TOKEN):
    def ready(d):
        try:
            r = requests.get(d.url + "/agent/v1/status", headers={"Authorization": f"Bearer {token}"},
                             timeout=2)
            return r.status_code == 200 and r.json()["engine_state"] == "ready"
        except (requests.RequestException, ValueError, KeyError):
            return False
    return procs.spawn("agent", lambda p: [fleet.agent_bin(), "--engine", "openai", "--listen",
                                           f"{HOST}:{p[0]}", "--upstream", engine_url],
                       env={"FLEETGATE_REPLICA_TOKEN": token}, ready=ready, ready_timeout=T(15))


def raw(port, method, target, body=b""):
    """One request sent byte for byte (no client library normalises the target); returns
    (status, headers text, body)."""
    head = (f"{method} {target} HTTP/1.1\r\nHost: {HOST}\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    with socket.create_connection((HOST, port), timeout=T(10)) as s:
        s.sendall(head.encode("latin-1") + body)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    header, _, rest = data.partition(b"\r\n\r\n")
    status = int(header.split(b" ", 2)[1]) if header.startswith(b"HTTP/1.1 ") else 0
    return status, header.decode("latin-1"), rest


CHAT_BODY = json.dumps({"model": "counted-model", "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 4}).encode()

# (method, target, expected status, expected code)
ATTACKS = [
    ("GET", "/v1/../slots", 400, "invalid_path"),
    ("POST", "/v1/../slots/0?action=save", 400, "invalid_path"),
    ("POST", "/v1/../slots/0?action=restore", 400, "invalid_path"),
    ("GET", "/v1/%2e%2e/slots", 400, "invalid_path"),
    ("GET", "/v1/%2E%2E/props", 400, "invalid_path"),
    ("GET", "/v1/..%2fslots", 400, "invalid_path"),
    ("GET", "/v1/%5c..%5cslots", 400, "invalid_path"),
    ("GET", "/v1\\..\\slots", 400, "invalid_path"),
    ("GET", "/v1//models", 400, "invalid_path"),
    ("GET", "//v1/models", 400, "invalid_path"),
    ("GET", "/v1/./models", 400, "invalid_path"),
    ("POST", "/v1/chat/completions/../../props", 400, "invalid_path"),
    ("POST", "/v1/chat/completions/..", 400, "invalid_path"),
    ("GET", "/slots", 404, "unknown_path"),
    ("GET", "/slots?fail_on_no_slot=1", 404, "unknown_path"),
    ("POST", "/slots/0?action=erase", 404, "unknown_path"),
    ("GET", "/props", 404, "unknown_path"),
    ("POST", "/props", 404, "unknown_path"),
    ("GET", "/metrics", 404, "unknown_path"),
    ("POST", "/tokenize", 404, "unknown_path"),
    ("POST", "/completion", 404, "unknown_path"),
    ("GET", "/lora-adapters", 404, "unknown_path"),
    ("POST", "/v1/embeddings", 404, "unknown_path"),
    ("GET", "/v1/models/counted-model", 404, "unknown_path"),
    ("GET", "/v1/", 404, "unknown_path"),
    ("GET", "/v1/chat/completions", 405, "method_not_allowed"),
    ("DELETE", "/v1/chat/completions", 405, "method_not_allowed"),
    ("PUT", "/v1/completions", 405, "method_not_allowed"),
    ("POST", "/v1/models", 405, "method_not_allowed"),
    ("OPTIONS", "/v1/models", 405, "method_not_allowed"),
    ("POST", "/v1/chat/completions?x=1", 400, "query_not_allowed"),
    ("GET", "/v1/models?limit=1", 400, "query_not_allowed"),
]


@pytest.mark.parametrize("method,target,status,code", ATTACKS, ids=[f"{a[0]} {a[1]}" for a in ATTACKS])
def test_only_the_allow_list_reaches_the_engine(procs, engine, method, target, status, code):
    d = start_agent(procs, engine.url)
    before = engine.requests_seen()
    got, headers, body = raw(d.ports[0], method, target, CHAT_BODY if method == "POST" else b"")
    assert got == status, (got, headers, body)
    err = json.loads(body)["error"]
    assert err["code"] == code and err["message"], err
    if status == 405:
        assert "\r\nAllow: " in headers, headers
    assert engine.requests_seen() == before, "the engine was reached"
    # the legitimate calls still go through, and are seen (so the count above could fail)
    got, _, body = raw(d.ports[0], "POST", "/v1/chat/completions", CHAT_BODY)
    assert got == 200, body
    got, _, body = raw(d.ports[0], "POST", "/v1/completions", CHAT_BODY)
    assert got == 200, body
    assert engine.requests_seen()[len(before):] == [("POST", "/v1/chat/completions"), ("POST", "/v1/completions")]


def test_refusals_need_the_token_first_and_are_logged(procs, engine):
    d = start_agent(procs, engine.url)
    r = requests.get(d.url + "/slots", timeout=T(5))
    assert r.status_code == 401, r.text  # no token: nothing about the allow-list is told
    for i in range(20):
        assert raw(d.ports[0], "GET", "/v1/../slots")[0] == 400
    got, _, body = raw(d.ports[0], "GET", "/v1/models")
    assert got == 200 and json.loads(body)["data"][0]["id"] == "counted-model", body
    assert engine.requests_seen() == [], engine.requests_seen()
    # one line a second, not one per refusal
    lines = [ln for ln in d.logs().splitlines() if "refused GET /v1/../slots" in ln]
    assert 1 <= len(lines) <= 5, lines


WEAK = ["", "changeme", "s3cret", "short-token-15c", "REPLACE_WITH_A_LONG_RANDOM_TOKEN",
        "aaaaaaaaaaaaaaaaaaaaaaaa", "a long token with spaces"]


@pytest.mark.parametrize("engine_args", [["--engine", "openai", "--upstream", "http://127.0.0.1:9"],
                                         ["--engine", "sim", "--model", "m"]], ids=["openai", "sim"])
def test_the_agent_refuses_weak_tokens(engine_args):
    env = {k: v for k, v in os.environ.items() if k != "FLEETGATE_REPLICA_TOKEN"}
    for tok in WEAK:
        out = subprocess.run([fleet.agent_bin(), *engine_args, "--listen", f"{HOST}:0"],
                             env={**env, "FLEETGATE_REPLICA_TOKEN": tok}, capture_output=True, text=True,
                             timeout=T(10))
        assert out.returncode == 2, (tok, out)
        assert "FLEETGATE_REPLICA_TOKEN" in out.stderr and "refusing to start" in out.stderr, (tok, out.stderr)
        # and even --insecure-private-network does not make a weak token acceptable
        out = subprocess.run([fleet.agent_bin(), *engine_args, "--listen", f"{HOST}:0",
                              "--insecure-private-network"] if engine_args[1] != "sim" else
                             [fleet.agent_bin(), *engine_args, "--listen", f"{HOST}:0"],
                             env={**env, "FLEETGATE_REPLICA_TOKEN": tok}, capture_output=True, text=True,
                             timeout=T(10))
        assert out.returncode == 2, (tok, out)


def test_a_real_engine_without_a_token_needs_the_explicit_flag():
    env = {k: v for k, v in os.environ.items() if k != "FLEETGATE_REPLICA_TOKEN"}
    out = subprocess.run([fleet.agent_bin(), "--engine", "openai", "--listen", f"{HOST}:0", "--upstream",
                          "http://127.0.0.1:9"], env=env, capture_output=True, text=True, timeout=T(10))
    assert out.returncode == 2, out
    assert "FLEETGATE_REPLICA_TOKEN is not set" in out.stderr and "--insecure-private-network" in out.stderr


def test_a_strong_token_starts_and_guards(procs, engine):
    d = start_agent(procs, engine.url, token="9f86d081884c7d659a2feaa0c55ad015")
    assert requests.get(d.url + "/v1/models", timeout=T(5)).status_code == 401
    r = requests.get(d.url + "/v1/models", headers={"Authorization": "Bearer 9f86d081884c7d659a2feaa0c55ad015"},
                     timeout=T(5))
    assert r.status_code == 200, r.text
