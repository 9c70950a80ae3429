"""fleetgate-agent in front of real engines, played by the simulated phone: `--engine llama`
starting and restarting `fleetgate-agent --engine sim` as its llama-server, `--engine openai`
and `--engine mnn` attached to a running sim, the MNN flavour through the official openai
npm client, /agent/v1/status and signed heartbeats with measured numbers, joining a real
gateway without a replica file, and draining on the gateway's word."""

import hashlib
import hmac
import json
import os
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

import fleet
from fleet import HOST, T

TOKEN = "agent-s3cret-token"
SECRET = "fleet-secret-0123456789abcdef"
CHAT = "/v1/chat/completions"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NODE_DIR = fleet.NODE_DIR


# ---------------------------------------------------------------------------- helpers

def sim_args(port, model="sim-model", slots=2, prefill_tps=200, decode_tps=20, time_scale=10,
             flavour=None, extra=()):
    argv = ["--engine", "sim", "--listen", f"{HOST}:{port}", "--model", model, "--slots", slots,
            "--prefill-tps", prefill_tps, "--decode-tps", decode_tps, "--time-scale", time_scale]
    if flavour:
        argv += ["--flavour", flavour]
    return [str(a) for a in argv + list(extra)]


def start_agent(procs, make_argv, n_ports=1, token=TOKEN, env=None, name="agent", ready=None,
                ready_timeout=15):
    e = dict(env or {})
    if token is not None:
        e["FLEETGATE_REPLICA_TOKEN"] = token
    d = procs.spawn(name, lambda ports: [fleet.agent_bin()] + [str(a) for a in make_argv(ports)],
                    n_ports=n_ports, env=e, ready=ready, ready_timeout=ready_timeout)
    if token is not None:
        d.headers["Authorization"] = f"Bearer {token}"
    return d


def status(d, **kw):
    r = d.get("/agent/v1/status", **kw)
    assert r.status_code == 200, (r.status_code, r.text)
    return r.json()


def engine_ready(d):
    try:  # runs before start_agent sets d.headers
        return status(d, timeout=2, headers=AUTH)["engine_state"] == "ready"
    except (requests.RequestException, AssertionError, ValueError):
        return False


def chat(d, content="Hello", max_tokens=8, stream=False, timeout=None, **kw):
    body = fleet.chat_body(content, max_tokens=max_tokens, stream=stream, **kw)
    return d.post(CHAT, json=body, stream=stream, timeout=timeout)


class Streamer:
    """A streamed chat completion read to its end in a thread, so the test can look at
    the agent while it runs (requests closes a stream that one stops iterating)."""

    def __init__(self, d, content, max_tokens, timeout=None):
        self.resp = chat(d, content, max_tokens=max_tokens, stream=True)
        self.res = None
        self.thread = threading.Thread(target=self._run, args=(timeout or T(60),), daemon=True)
        self.thread.start()

    def _run(self, timeout):
        self.res = fleet.read_sse(self.resp, timeout=timeout)

    def join(self, timeout=None):
        self.thread.join(timeout or T(60))
        return self.res


def leave_after_first_chunks(d, body, n_events=2):
    """A raw client that reads n_events of a stream and then closes its socket."""
    import socket  # noqa: PLC0415
    raw = fleet.http_request_bytes("POST", CHAT, body, headers=AUTH, port=d.port)
    with socket.create_connection((HOST, d.port), timeout=T(10)) as s:
        s.sendall(raw)
        got = b""
        deadline = time.monotonic() + T(10)
        while got.count(b"data:") < n_events and time.monotonic() < deadline:
            b = s.recv(65536)
            if not b:
                break
            got += b
    return got


def check_openai_error(r, status, what=""):
    assert r.status_code == status, f"{what}: {r.status_code} {r.text[:300]}"
    e = r.json()["error"]
    assert set(e) >= {"message", "type", "param", "code"}, e
    return e


def within(v, want, tol=0.2):
    return v is not None and abs(v - want) <= tol * want


def key_signed(body, ts, ksig):
    """The heartbeat is signed by the key its body names (Ed25519 over TS "." BODY)."""
    import base64
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    try:
        pub = Ed25519PublicKey.from_public_bytes(base64.b64decode(json.loads(body)["key"]))
        assert ksig.startswith("ed25519=")
        pub.verify(base64.b64decode(ksig[8:]), ts.encode() + b"." + body)
        return True
    except (InvalidSignature, AssertionError, KeyError, ValueError):
        return False


class FakeGateway:
    """A heartbeat endpoint that checks each heartbeat's signature as docs/protocol.md
    says, records the bodies and answers with a drain flag the test controls."""

    def __init__(self, secret=SECRET, interval_s=0.2):
        self.secret = secret.encode()
        self.interval_s = interval_s
        self.drain = False
        self.beats = []
        self.refused = []
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                ts = self.headers.get("x-fleetgate-timestamp", "")
                sig = self.headers.get("x-fleetgate-signature", "")
                want = "sha256=" + hmac.new(outer.secret, ts.encode() + b"." + body,
                                            hashlib.sha256).hexdigest()
                ok = (self.path == "/fleet/v1/heartbeat" and hmac.compare_digest(sig, want)
                      and ts.isdigit() and abs(int(ts) - time.time() * 1000) < 30000
                      and key_signed(body, ts, self.headers.get("x-fleetgate-key-signature", "")))
                with outer.lock:
                    if ok:
                        outer.beats.append((int(ts), json.loads(body)))
                    else:
                        outer.refused.append((self.path, ts, sig))
                    drain = outer.drain
                reply = {"id": "x", "accepted": ok, "interval_s": outer.interval_s, "drain": drain,
                         "state": "ready"}
                data = json.dumps(reply if ok else {"error": {"code": "invalid_signature"}}).encode()
                self.send_response(200 if ok else 401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer((HOST, 0), H)
        self.url = f"http://{HOST}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def last(self):
        with self.lock:
            return self.beats[-1][1] if self.beats else None

    def count(self):
        with self.lock:
            return len(self.beats)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_gateway():
    g = FakeGateway()
    yield g
    g.close()


# ---------------------------------------------------------------------------- engine llama

def test_llama_engine_starts_serves_restarts_and_requires_token(procs, tmp_path):
    """--engine llama whose command is a sim: the agent starts it, forwards whole and
    streamed answers, restarts it after kill -9 and serves again; no token, no service."""

    def argv(ports):
        cfg = {"command": fleet.agent_bin(), "args": sim_args(ports[1]),
               "upstream": f"http://{HOST}:{ports[1]}", "restart_max_s": 2}
        path = tmp_path / "agent.json"
        path.write_text(json.dumps(cfg))
        return ["--engine", "llama", "--listen", f"{HOST}:{ports[0]}", "--config", path, "--id", "phone-1"]

    d = start_agent(procs, argv, n_ports=2, ready=engine_ready)
    st = status(d)
    assert st["engine"] == "llama" and st["engine_state"] == "ready", st
    assert st["slots"] == 2 and st["n_ctx"] == 4096 and st["models"] == ["sim-model"], st
    pid = st["engine_pid"]
    assert isinstance(pid, int) and pid > 0, st

    r = chat(d, max_tokens=6)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] == 6, body
    r = chat(d, max_tokens=5, stream=True, stream_options={"include_usage": True})
    assert r.headers["Content-Type"].startswith("text/event-stream")
    res = fleet.read_sse(r)
    assert res.done, res.data
    texts = [c["choices"][0]["delta"].get("content") for c in res.chunks() if c["choices"]]
    assert len([t for t in texts if t]) == 5, res.data

    # the token, everywhere
    for path, method in ((CHAT, "POST"), ("/agent/v1/status", "GET"), ("/v1/models", "GET"),
                         ("/health", "GET")):
        r = d.request(method, path, auth=False, json=fleet.chat_body("x") if method == "POST" else None)
        check_openai_error(r, 401, f"{method} {path} without a token")
        r = d.request(method, path, auth=False, headers={"Authorization": "Bearer wrong"})
        check_openai_error(r, 401, f"{method} {path} with a wrong token")

    # kill -9 the engine: the agent notices, restarts it and serves again
    os.kill(pid, signal.SIGKILL)
    assert fleet.wait_until(lambda: status(d)["engine_state"] != "ready", T(5)), "never noticed"
    st = fleet.wait_until(lambda: (lambda s: s if s["engine_state"] == "ready" and s["engine_pid"] != pid
                                   else None)(status(d)), T(15), interval=0.1)
    assert st, status(d)
    assert st["engine_restarts"] >= 1 and st["engine_pid"] != pid, st
    r = chat(d, max_tokens=4)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text

    # SIGTERM stops the engine too
    new_pid = st["engine_pid"]
    d.stop()
    assert d.stopped_rc == 0
    assert fleet.wait_until(lambda: not Path(f"/proc/{new_pid}").exists()
                            or "zombie" in Path(f"/proc/{new_pid}/status").read_text().lower(), T(10)), \
        "the engine outlived the agent"


def test_llama_engine_from_environment_and_a_client_that_leaves(procs):
    """Engine command and arguments from FLEETGATE_ENGINE_*; a client that disconnects
    mid-stream frees the engine's slot."""
    # the environment names the engine's port, so pick it first
    port = fleet.free_port()
    env = {"FLEETGATE_ENGINE_COMMAND": fleet.agent_bin(),
           "FLEETGATE_ENGINE_ARGS": " ".join(sim_args(port, slots=1, decode_tps=5, time_scale=1))}
    d = start_agent(procs, lambda ports: ["--engine", "llama", "--listen", f"{HOST}:{ports[0]}",
                                          "--upstream", f"http://{HOST}:{port}"],
                    env=env, ready=engine_ready)
    st = Streamer(d, "stay", max_tokens=5)  # 1 s
    assert fleet.wait_until(lambda: status(d)["busy"] == 1, T(5)), status(d)
    assert st.join().done
    got = leave_after_first_chunks(d, fleet.chat_body("leave", max_tokens=200, stream=True))
    assert b"data:" in got, got
    assert fleet.wait_until(lambda: status(d)["busy"] == 0, T(5)), status(d)
    # the engine's only slot is free again: a new request is answered at once
    t0 = time.monotonic()
    r = chat(d, max_tokens=2)
    assert r.status_code == 200, r.text
    assert time.monotonic() - t0 < T(3)
    sim = requests.get(f"http://{HOST}:{port}/slots", timeout=5).json()
    assert not any(s["is_processing"] for s in sim), sim


def test_an_engine_deaf_to_sigterm_is_killed_after_stop_timeout(procs, tmp_path):
    """An engine that does not heed SIGTERM (a script standing in for llama-server that
    traps it, as a llama-server with a stream still open may take its time) is killed
    stop_timeout_s after the agent asks it to stop, and the agent exits cleanly then:
    a deaf engine never holds the agent's exit."""
    pidfile = tmp_path / "engine.pid"
    script = tmp_path / "llama-server"
    # the shell ignores SIGTERM and waits for the sim it runs (a sim exec'd would set its
    # own handler); the sim is stopped by the test
    script.write_text("#!/bin/sh\n"
                      "trap '' TERM\n"
                      f"'{fleet.agent_bin()}' \"$@\" &\n"
                      f"echo $$ $! > '{pidfile}'\n"
                      "wait\n")
    script.chmod(0o755)

    def argv(ports):
        cfg = {"command": str(script), "args": sim_args(ports[1]), "upstream": f"http://{HOST}:{ports[1]}",
               "stop_timeout_s": 1}
        path = tmp_path / "agent.json"
        path.write_text(json.dumps(cfg))
        return ["--engine", "llama", "--listen", f"{HOST}:{ports[0]}", "--config", path]

    d = start_agent(procs, argv, n_ports=2, ready=engine_ready)
    assert chat(d, max_tokens=2).status_code == 200
    engine, sim = (int(x) for x in pidfile.read_text().split())
    try:
        t0 = time.monotonic()
        rc = d.stop(timeout=T(8))
        took = time.monotonic() - t0
        assert not d.killed, f"the agent ignored SIGTERM for {took:.1f} s: its engine's kill timer never fired"
        assert rc == 0, rc
        assert 0.9 <= took < T(6), took  # SIGKILL after stop_timeout_s (1 s), not at once
        with pytest.raises(ProcessLookupError):
            os.kill(engine, 0)
    finally:
        try:
            os.kill(sim, signal.SIGKILL)
        except ProcessLookupError:
            pass
    err = Path(d.stderr_path).read_text()
    assert "ignored SIGTERM for 1 s: SIGKILL" in err, err[-2000:]


def test_engine_inherits_none_of_the_agents_secrets(procs, tmp_path, fake_gateway):
    """The engine the agent starts (a script standing in for llama-server: it writes down
    its environment and the agent's /proc/PID/environ, then runs the sim) gets none of
    the agent's secrets -- fleet secret, replica token, the phone's and the tunnel's
    private keys, the engine's API key -- by name or by value, while an ordinary variable
    passes and the agent still uses each secret it needs: its front takes the token, its
    heartbeats carry the fleet secret's HMAC and the kept key's signature."""
    import base64  # noqa: PLC0415
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519  # noqa: PLC0415

    def pkcs8_b64(k):
        return base64.b64encode(k.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption())).decode()

    ident = ed25519.Ed25519PrivateKey.generate()
    secrets = {"FLEETGATE_FLEET_SECRET": SECRET, "FLEETGATE_REPLICA_TOKEN": TOKEN,
               "FLEETGATE_AGENT_KEY": pkcs8_b64(ident),
               "FLEETGATE_TUNNEL_KEY": pkcs8_b64(ec.generate_private_key(ec.SECP256R1())),
               "FLEETGATE_ENGINE_API_KEY": "engine-api-key-0123456789abcdef"}
    public = base64.b64encode(ident.public_key().public_bytes(serialization.Encoding.Raw,
                                                              serialization.PublicFormat.Raw)).decode()
    dump, parent = tmp_path / "engine.env", tmp_path / "agent.environ"
    script = tmp_path / "llama-server"
    script.write_text("#!/bin/sh\n"
                      f"env > '{dump}.tmp' && mv '{dump}.tmp' '{dump}'\n"
                      f"tr '\\000' '\\n' < /proc/$PPID/environ > '{parent}.tmp' && mv '{parent}.tmp' '{parent}'\n"
                      f"exec '{fleet.agent_bin()}' \"$@\"\n")
    script.chmod(0o755)

    def argv(ports):
        cfg = {"command": str(script), "args": sim_args(ports[1]), "upstream": f"http://{HOST}:{ports[1]}"}
        path = tmp_path / "agent.json"
        path.write_text(json.dumps(cfg))
        return ["--engine", "llama", "--listen", f"{HOST}:{ports[0]}", "--config", path, "--id", "phone-env",
                "--gateway", fake_gateway.url, "--public-url", f"http://{HOST}:{ports[0]}"]

    env = {k: v for k, v in secrets.items() if k != "FLEETGATE_REPLICA_TOKEN"}
    env["FLEETGATE_TEST_ORDINARY"] = "passes-through"
    d = start_agent(procs, argv, n_ports=2, env=env, ready=engine_ready)
    r = chat(d, max_tokens=4)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
    check_openai_error(d.post(CHAT, auth=False, json=fleet.chat_body("x")), 401, "without the token")
    assert fleet.wait_until(lambda: fake_gateway.count() >= 2, T(5)), fake_gateway.refused
    assert not fake_gateway.refused, fake_gateway.refused
    assert fake_gateway.last()["key"] == public, fake_gateway.last()

    assert fleet.wait_until(lambda: dump.exists() and parent.exists(), T(5))
    child = dump.read_text()
    assert "FLEETGATE_TEST_ORDINARY=passes-through" in child, child
    seen = parent.read_text()
    assert "FLEETGATE_TEST_ORDINARY=passes-through" in seen, seen
    for name, value in secrets.items():
        assert name not in child, f"the engine's environment holds {name}"
        assert value not in child, f"the engine's environment holds the value of {name}"
    for name, value in secrets.items():
        assert value not in seen, f"the agent's /proc/PID/environ shows the value of {name}"


def test_llama_engine_reports_the_progress_of_running_requests(procs, tmp_path):
    """While requests run on llama-server (the sim), the agent reads its /slots and
    shows each one in /agent/v1/status's running list: the caller's x-request-id, a
    prompt_done that grows while the prompt is read, and its pace; nothing once done."""

    def argv(ports):
        # wall-clock rates: a 1250-token prompt takes 5 s to read, 25 tokens 2.5 s to write
        cfg = {"command": fleet.agent_bin(), "upstream": f"http://{HOST}:{ports[1]}",
               "args": sim_args(ports[1], slots=2, prefill_tps=250, decode_tps=10, time_scale=1)}
        path = tmp_path / "agent.json"
        path.write_text(json.dumps(cfg))
        return ["--engine", "llama", "--listen", f"{HOST}:{ports[0]}", "--config", path]

    d = start_agent(procs, argv, n_ports=2, ready=engine_ready)
    assert status(d)["running"] == [], status(d)
    answers = {}

    def ask(rid, chars, max_tokens):
        body = fleet.chat_body("lorem ipsum " * (chars // 12), max_tokens=max_tokens)
        answers[rid] = d.post(CHAT, json=body, headers={"x-request-id": rid}, timeout=T(60))

    first = threading.Thread(target=ask, args=("some-id", 5000, 25), daemon=True)
    first.start()
    seen = []

    def progressing():
        mine = [x for x in status(d)["running"] if x["request_id"] == "some-id"]
        if mine:
            seen.append(mine[0])
        grew = [b for a, b in zip(seen, seen[1:]) if b["prompt_done"] > a["prompt_done"]]
        return grew and grew[-1]["prefill_tps"] and grew[-1]["prompt_done"] < grew[-1]["prompt_tokens"] \
            and grew[-1]

    got = fleet.wait_until(progressing, T(4), interval=0.2)
    assert got, seen
    assert got["prompt_tokens"] > 1200 and got["prefill_tps"] > 0 and got["decoded"] == 0, got
    # the pace is the sim's, give or take a reading's timing (and the scheduler's)
    assert 100 <= got["prefill_tps"] <= 600, got

    # a second request on the other slot: each slot is paired with its own caller
    second = threading.Thread(target=ask, args=("other-id", 2000, 2), daemon=True)
    second.start()

    def both():
        run = {x["request_id"]: x for x in status(d)["running"]}
        return run if set(run) == {"some-id", "other-id"} else None

    run = fleet.wait_until(both, T(3), interval=0.2)
    assert run, status(d)
    assert run["some-id"]["prompt_tokens"] > run["other-id"]["prompt_tokens"] > 400, run

    # once it generates: tokens out and their pace
    def decoding():
        mine = [x for x in status(d)["running"] if x["request_id"] == "some-id"]
        return mine and mine[0]["decoded"] > 0 and mine[0]["decode_tps"] and mine[0]

    got = fleet.wait_until(decoding, T(8), interval=0.2)
    assert got, status(d)
    assert got["prompt_done"] == got["prompt_tokens"] and 3 <= got["decode_tps"] <= 30, got

    first.join(T(60))
    second.join(T(60))
    for rid in ("some-id", "other-id"):
        assert answers[rid].status_code == 200, answers[rid].text
    assert status(d)["running"] == [], status(d)


def test_real_engine_refuses_to_start_without_token(procs, tmp_path):
    out = subprocess.run([fleet.agent_bin(), "--engine", "openai", "--listen", f"{HOST}:0",
                          "--upstream", "http://127.0.0.1:9"],
                         env={k: v for k, v in os.environ.items() if k != "FLEETGATE_REPLICA_TOKEN"},
                         capture_output=True, text=True, timeout=T(10))
    assert out.returncode == 2, out
    assert "FLEETGATE_REPLICA_TOKEN" in out.stderr and "--insecure-private-network" in out.stderr, out.stderr
    # told it is on a private network, it serves (the engine is down: 503, not a crash)
    d = start_agent(procs, lambda p: ["--engine", "openai", "--listen", f"{HOST}:{p[0]}",
                                      "--upstream", "http://127.0.0.1:9", "--insecure-private-network"],
                    token=None)
    r = d.post(CHAT, json=fleet.chat_body("x"))
    e = check_openai_error(r, 503, "engine down")
    assert r.headers.get("Retry-After"), r.headers
    assert e["type"] == "unavailable_error", e


class SilentEngine:
    """An OpenAI-compatible engine that is healthy (/health, /v1/models answer) but
    accepts each completion, reads it and closes the connection without a status line:
    the agent's relay ends with no response code at all."""

    def __init__(self):
        self.completions = 0
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                if self.path in ("/health", "/v1/models"):
                    data = json.dumps({"status": "ok"} if self.path == "/health" else
                                      {"object": "list", "data": [{"id": "silent-model"}]}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                else:
                    data = b"{}"
                    self.send_response(404)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with outer.lock:
                    outer.completions += 1
                self.close_connection = True  # nothing written: the socket just closes

        self.server = ThreadingHTTPServer((HOST, 0), H)
        self.url = f"http://{HOST}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_engine_that_closes_without_answering_gets_a_clean_502(procs):
    """An engine that hangs up before any status line: the caller gets 502 in OpenAI's
    shape (whole and streamed), and the agent keeps serving. The relay's done callback
    reads the (absent) status on this path: run under FLEETGATE_VALGRIND=1 it shows
    that no freed curl handle is touched."""
    engine = SilentEngine()
    try:
        d = start_agent(procs, lambda p: ["--engine", "openai", "--listen", f"{HOST}:{p[0]}",
                                          "--upstream", engine.url], ready=engine_ready)
        for stream in (False, True, False):
            r = chat(d, "hang up on me", max_tokens=4, stream=stream, timeout=T(20))
            e = check_openai_error(r, 502, f"silent engine, stream={stream}")
            assert r.headers["Content-Type"].startswith("application/json"), r.headers
            assert e["type"] == "server_error" and e["code"] == "engine_unreachable", e
            assert "the engine did not answer" in e["message"], e
        assert engine.completions == 3
        # the engine still answers its probes: the agent stays ready and serves status
        assert fleet.wait_until(lambda: engine_ready(d), T(5))
        assert status(d)["busy"] == 0
    finally:
        engine.close()


def test_front_reads_the_token_by_the_one_bearer_rule(procs):
    """docs/security.md#bearer-tokens: the scheme in any case, one or more spaces, the
    whole token and nothing else; answers 401 in OpenAI's shape otherwise."""
    d = start_agent(procs, lambda p: ["--engine", "openai", "--listen", f"{HOST}:{p[0]}",
                                      "--upstream", "http://127.0.0.1:9"])
    for value in (f"Bearer {TOKEN}", f"bearer {TOKEN}", f"BEARER {TOKEN}", f"Bearer   {TOKEN}"):
        r = d.get("/agent/v1/status", auth=False, headers={"Authorization": value})
        assert r.status_code == 200, (value, r.status_code, r.text)
    for value in ("Bearer", "Bearer ", f"Basic {TOKEN}", f"Bearer{TOKEN}", f"Bearer {TOKEN[:-1]}",
                  f"Bearer {TOKEN}x", f"Bearer {TOKEN.upper()}", TOKEN):
        r = d.get("/agent/v1/status", auth=False, headers={"Authorization": value})
        e = check_openai_error(r, 401, repr(value))
        assert e["type"] == "authentication_error", e
        assert r.headers.get("WWW-Authenticate", "").startswith("Bearer"), r.headers


# ---------------------------------------------------------------------------- MNN

def test_mnn_flavour_normalised_for_the_openai_npm_client(procs, sim):
    fleet.need_node_openai()
    engine = sim(model="mnn-model", extra_args=("--flavour", "mnn"), decode_tps=200, name="mnn")
    # the flavour has MNN's quirks
    assert engine.get("/health").status_code == 404
    raw = engine.post(CHAT, json=fleet.chat_body("hi", max_tokens=3, stream=True))
    data = fleet.read_sse(raw)
    chunks = data.chunks()
    assert len(chunks) > 3 and chunks[0]["choices"][0]["finish_reason"] == "", chunks[0]
    assert engine.post(CHAT, data=b"{bad").json()["error"].startswith("[json"), "MNN's error shape"

    d = start_agent(procs, lambda p: ["--engine", "mnn", "--listen", f"{HOST}:{p[0]}", "--upstream", engine.url],
                    ready=engine_ready)
    st = status(d)
    assert st["slots"] == 1 and st["models"] == ["mnn-model"], st
    cap = 5
    out = subprocess.run(["node", str(NODE_DIR / "agent-mnn.mjs"), d.url + "/v1", TOKEN, "mnn-model", str(cap)],
                         capture_output=True, text=True, timeout=T(60), cwd=NODE_DIR)
    assert out.returncode == 0, (out.stdout, out.stderr)
    res = json.loads(out.stdout)
    w = res["whole"]
    assert w["object"] == "chat.completion" and w["role"] == "assistant", w
    assert w["finish_reason"] == "length", w
    assert w["usage"]["completion_tokens"] == cap and w["usage"]["prompt_tokens"] > 0, w
    assert w["usage"]["total_tokens"] == w["usage"]["prompt_tokens"] + cap, w
    chunks = res["stream"]["chunks"]
    texts = [c["content"] for c in chunks if c["content"]]
    assert len(texts) == cap, chunks
    finishes = [c["finish_reason"] for c in chunks if c["n_choices"]]
    assert "" not in finishes, finishes
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1]), finishes
    assert chunks[-1]["n_choices"] == 0 and chunks[-1]["usage"]["completion_tokens"] == cap, chunks[-1]

    # errors in OpenAI's shape, and the engine is free for the next request
    r = d.post(CHAT, json={"model": "mnn-model", "messages": []})
    check_openai_error(r, 400, "invalid body")
    r = d.post(CHAT, json=fleet.chat_body("again", max_tokens=2))
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text


def test_mnn_agent_passes_engine_refusals_on(procs, sim):
    """An engine that refuses a request the way llama.cpp does (500 and a message quoting
    the request; the MNN-flavoured sim refuses like llama-server, in MNN's error shape)
    is passed on in OpenAI's error shape, whole and still 500: the agent does not turn a
    malformed message into a 400 of its own, and the gateway decides what it means."""
    engine = sim(model="mnn-model", extra_args=("--flavour", "mnn"), decode_tps=200, name="mnn")
    d = start_agent(procs, lambda p: ["--engine", "mnn", "--listen", f"{HOST}:{p[0]}", "--upstream", engine.url],
                    ready=engine_ready)
    hi = [{"role": "user", "content": "hi"}]
    no_description = [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}]
    cases = [
        ({"messages": hi, "n": 2}, fleet.Capture("error-n2.http")),
        ({"messages": hi, "n": 2, "stream": True}, fleet.Capture("error-n2.http")),
        ({"messages": hi, "tools": no_description}, fleet.Capture("error-tools.http")),
        ({"messages": [{"role": "user", "content": 42}]}, fleet.Capture("error-content-type.http")),
        ({"messages": [{"content": "hi"}]},
         "Failed to parse messages: Missing 'role' in message: {\"content\":\"hi\"}; messages = [\n  {\n"
         "    \"content\": \"hi\"\n  }\n]"),
        ({"messages": "hi"},
         "Failed to parse messages: Expected 'messages' to be an array, got \"hi\"; messages = \"hi\""),
    ]
    for body, want in cases:
        message = want if isinstance(want, str) else want.json()["error"]["message"]
        r = d.post(CHAT, json={"model": "mnn-model", **body})
        e = check_openai_error(r, 500, f"refusal of {body}")
        assert e == {"message": message, "type": "server_error", "param": None, "code": None}, (body, e)
    r = chat(d, "and now a good one", max_tokens=2)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text


# ---------------------------------------------------------------------------- status, heartbeats

def test_status_and_heartbeats_carry_measured_numbers(procs, sim, fake_gateway):
    """--engine openai in front of a sim: rates learnt from the answers' timings match the
    sim's (x time scale) within 20 %, busy slots match what runs, and the signed heartbeats
    say the same."""
    scale = 10
    engine = sim(slots=3, prefill_tps=200, decode_tps=20, time_scale=scale, name="engine")
    d = start_agent(procs, lambda p: ["--engine", "openai", "--listen", f"{HOST}:{p[0]}", "--upstream",
                                      engine.url, "--id", "phone-7", "--gateway", fake_gateway.url,
                                      "--public-url", f"http://{HOST}:{p[0]}"],
                    env={"FLEETGATE_FLEET_SECRET": SECRET}, ready=engine_ready)
    st = status(d)
    assert st["rates_source"] == "none" and st["prefill_tps"] is None, st
    for i in range(4):
        r = chat(d, fleet.make_prompt(200, tag=f"rate{i}"), max_tokens=10, stream=i % 2 == 1)
        assert r.status_code == 200
        if i % 2:
            assert fleet.read_sse(r).done
    st = status(d)
    assert st["rates_source"] == "measured", st
    assert within(st["prefill_tps"], 200 * scale), st
    assert within(st["decode_tps"], 20 * scale), st
    for k in ("battery_pct", "charging", "temperature_c", "mem_free_mb"):
        assert k in st["device"], st
    assert st["version"] and st["uptime_s"] > 0

    # two long streams running (2 s each): busy 2 in the status and soon in a heartbeat
    rs = [Streamer(d, f"busy {i}", max_tokens=400) for i in range(2)]
    assert fleet.wait_until(lambda: status(d)["busy"] == 2, T(5)), status(d)
    n = fake_gateway.count()
    assert fleet.wait_until(lambda: fake_gateway.count() > n + 1, T(5))
    hb = fake_gateway.last()
    assert hb["busy"] == 2 and hb["slots"] == 3 and hb["id"] == "phone-7", hb
    assert hb["url"] == d.url and hb["models"] == ["sim-model"] and hb["state"] == "ready", hb
    assert within(hb["prefill_tps"], 200 * scale) and within(hb["decode_tps"], 20 * scale), hb
    assert set(hb) <= {"id", "url", "key", "models", "slots", "busy", "n_ctx", "prefill_tps", "decode_tps",
                       "state", "device", "version", "uptime_s"}, hb
    for r in rs:
        assert r.join().done
    assert fleet.wait_until(lambda: status(d)["busy"] == 0, T(5))
    assert not fake_gateway.refused, fake_gateway.refused
    # timestamps grow strictly (the gateway refuses replays)
    ts = [t for t, _ in fake_gateway.beats]
    assert ts == sorted(set(ts)), ts


def test_sim_serves_status_with_its_own_slots(sim):
    d = sim(slots=2, prefill_tps=500, decode_tps=50, time_scale=10, token=TOKEN)
    r = d.get("/agent/v1/status", auth=False)
    assert r.status_code == 401
    st = status(d)
    assert st["engine"] == "sim" and st["engine_state"] == "ready" and st["slots"] == 2 and st["busy"] == 0, st
    assert st["rates_source"] == "configured" and st["prefill_tps"] == 5000 and st["decode_tps"] == 500, st
    r = Streamer(d, "long", max_tokens=100)  # 2 s
    assert fleet.wait_until(lambda: status(d)["busy"] == 1, T(5)), status(d)
    assert r.join().done
    assert fleet.wait_until(lambda: status(d)["busy"] == 0, T(5))


def fake_phone(root, capacity="81", status="Charging", bat_temp="312", cpu_temp="61200", big_cap="1420800",
               meminfo="MemTotal: 16000000 kB\nMemAvailable:  831488 kB\n"):
    """A phone's /sys and /proc below root, as Android lays them out: a USB supply and the
    battery, a battery zone, two CPU zones and a hotter board zone, four little cores
    and four big ones (the big ones capped to big_cap kHz of 2841600). None: no file."""
    def put(rel, text):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            p.unlink(missing_ok=True)
        else:
            p.write_text(text + "\n")
    put("sys/class/power_supply/usb/type", "USB")
    put("sys/class/power_supply/battery/type", "Battery")
    put("sys/class/power_supply/battery/capacity", capacity)
    put("sys/class/power_supply/battery/status", status)
    put("sys/class/power_supply/battery/temp", bat_temp)
    for i, (kind, temp) in enumerate((("battery", "31000"), ("cpu-1-0-usr", "55000"), ("cpuss-0", cpu_temp),
                                      ("xo-therm", "90000"))):
        put(f"sys/class/thermal/thermal_zone{i}/type", kind)
        put(f"sys/class/thermal/thermal_zone{i}/temp", None if cpu_temp is None and kind.startswith("cpu") else temp)
    for i in range(8):
        top, cap = ("1804800", "1804800") if i < 4 else ("2841600", big_cap)
        put(f"sys/devices/system/cpu/cpu{i}/cpufreq/cpuinfo_max_freq", top)
        put(f"sys/devices/system/cpu/cpu{i}/cpufreq/scaling_max_freq", cap)
    put("proc/meminfo", meminfo)


CPU_HALF_BIG = round((4 * 1804800 + 4 * 1420800) / (4 * 1804800 + 4 * 2841600), 3)


def test_device_readings_from_sys(procs, tmp_path, sim):
    """--sysfs-root DIR: battery, charging, the hottest CPU zone, free and total memory and
    the CPU clock cap read from a fake tree; an empty tree says null for each; a root that is not
    a folder is refused at start. FLEETGATE_AGENT_SYSROOT still works."""
    root = tmp_path / "root"
    fake_phone(root)
    d = sim(token=TOKEN, extra_args=("--sysfs-root", str(root)))
    dev = status(d)["device"]
    assert dev == {"battery_pct": 81, "charging": True, "temperature_c": 61.2, "temperature_source": "cpu",
                   "mem_free_mb": 812, "mem_total_mb": 15625, "cpu_max_freq_ratio": CPU_HALF_BIG}, dev
    empty = tmp_path / "empty"
    empty.mkdir()
    d2 = sim(token=TOKEN, env={"FLEETGATE_AGENT_SYSROOT": str(empty)}, name="sim2")
    dev = status(d2)["device"]
    assert dev == {"battery_pct": None, "charging": None, "temperature_c": None, "temperature_source": None,
                   "mem_free_mb": None, "mem_total_mb": None, "cpu_max_freq_ratio": None}, dev
    hb_keys = {"battery_pct", "charging", "temperature_c", "mem_free_mb", "mem_total_mb", "cpu_max_freq_ratio"}
    assert set(dev) == hb_keys | {"temperature_source"}
    for bad in (tmp_path / "missing", root / "proc/meminfo"):
        p = subprocess.run([fleet.agent_bin(), "--engine", "sim", "--listen", f"{HOST}:0", "--model", "m",
                            "--sysfs-root", str(bad)], capture_output=True, text=True, timeout=T(10))
        assert p.returncode == 1 and "--sysfs-root: not a directory" in p.stderr, (p.returncode, p.stderr)


def test_drain_refuses_new_work_and_finishes_running(procs, sim, fake_gateway):
    engine = sim(slots=2, decode_tps=20, time_scale=10, name="engine")
    d = start_agent(procs, lambda p: ["--engine", "openai", "--listen", f"{HOST}:{p[0]}", "--upstream",
                                      engine.url, "--gateway", fake_gateway.url, "--public-url",
                                      f"http://{HOST}:{p[0]}"],
                    env={"FLEETGATE_FLEET_SECRET": SECRET}, ready=engine_ready)
    assert fleet.wait_until(lambda: fake_gateway.count() >= 1, T(5))
    running = Streamer(d, "a long one", max_tokens=400)  # 2 s at 200 tok/s
    assert fleet.wait_until(lambda: status(d)["busy"] == 1, T(5)), status(d)
    fake_gateway.drain = True
    assert fleet.wait_until(lambda: status(d)["draining"], T(5)), status(d)
    r = chat(d, "new work", max_tokens=2)
    e = check_openai_error(r, 503, "new work while draining")
    assert e["code"] == "draining" and r.headers.get("Retry-After"), (e, r.headers)
    assert fleet.wait_until(lambda: (fake_gateway.last() or {}).get("state") == "draining", T(5))
    assert running.thread.is_alive(), "the running answer ended too early"
    rest = running.join()
    assert rest.done and len(rest.data) > 400, rest.data[-3:]  # the running answer finished
    fake_gateway.drain = False
    assert fleet.wait_until(lambda: not status(d)["draining"], T(5))
    assert chat(d, "welcome back", max_tokens=2).status_code == 200


# ---------------------------------------------------------------------------- a real gateway

def gw_config(port, replicas=(), interval=0.2):
    return {
        "listen": [{"address": f"{HOST}:{port}"}],
        "fleet": {"secret_env": "FLEETGATE_FLEET_SECRET", "replica_token_env": "FLEETGATE_REPLICA_TOKEN",
                  "heartbeat_timeout_s": 5, "heartbeat_interval_s": interval},
        "health": {"interval_s": 0.5, "timeout_s": 1, "rise": 1, "fall": 2,
                   "readyz_counts": True},  # readyz() reads them
        "upstream": dict(fleet.ALLOW_LOOPBACK),
        "queue": {"max": 100, "timeout_s": 30},
        "scheduler": {"retries": 2, "default_max_tokens": 64},
        "log_level": "info",
        "replicas": list(replicas),
    }


def readyz(g):
    try:
        return requests.get(g.url + "/readyz", timeout=1).json().get("replicas_ready") or 0
    except (requests.RequestException, ValueError):
        return 0


GW_ENV = {"FLEETGATE_FLEET_SECRET": SECRET, "FLEETGATE_REPLICA_TOKEN": TOKEN}


def test_sim_agent_joins_a_real_gateway_without_a_replica_file(procs, gateway, sim):
    g = gateway(lambda ports: gw_config(ports[0]), env=GW_ENV)
    procs.spawn("phone", lambda ports: fleet.sim_argv(
        ports[0], slots=2, prefill_tps=500, decode_tps=50, time_scale=10, id="phone-9",
        extra_args=("--gateway", g.url, "--public-url", f"http://{HOST}:{ports[0]}")),
        env={"FLEETGATE_FLEET_SECRET": SECRET, "FLEETGATE_REPLICA_TOKEN": TOKEN})
    assert fleet.wait_until(lambda: readyz(g) >= 1, T(10)), g.logs()
    r = requests.post(g.url + CHAT, json=fleet.chat_body("through the gateway", max_tokens=5), timeout=T(15))
    assert r.status_code == 200, r.text
    assert r.headers.get("x-fleetgate-replica") == "phone-9", r.headers
    assert r.json()["usage"]["completion_tokens"] == 5
    r = requests.post(g.url + CHAT, json=fleet.chat_body("streamed", max_tokens=3, stream=True),
                      stream=True, timeout=T(15))
    assert fleet.read_sse(r).done
    assert "replica registered by heartbeat" in Path(g.stderr_path).read_text()


def test_device_state_from_sys_reaches_the_gateway_admin_api_and_metrics(procs, gateway, sim, tmp_path):
    """A sim phone reads a fake /sys and /proc (--sysfs-root) and heartbeats a real gateway:
    battery, charging, temperature, free memory and the CPU clock cap show in
    /admin/v1/replicas, in /admin/v1/status (what the status page draws) and in /metrics,
    follow the files when they change, and turn unknown when a file turns unreadable."""
    admin_token = "admin-token-0123456789"
    g = gateway(lambda ports: dict(gw_config(ports[0]), admin={"listen": f"{HOST}:{ports[1]}", "token": admin_token}),
                n_ports=2, env=GW_ENV)
    admin = f"http://{HOST}:{g.ports[1]}"
    ah = {"Authorization": f"Bearer {admin_token}"}
    root = tmp_path / "phone-root"
    fake_phone(root)
    procs.spawn("phone", lambda ports: fleet.sim_argv(
        ports[0], id="phone-d", extra_args=("--gateway", g.url, "--public-url", f"http://{HOST}:{ports[0]}",
                                            "--sysfs-root", str(root))),
        env={"FLEETGATE_FLEET_SECRET": SECRET, "FLEETGATE_REPLICA_TOKEN": TOKEN})

    def rep():
        r = requests.get(admin + "/admin/v1/replicas", headers=ah, timeout=T(5))
        assert r.status_code == 200, r.text
        return {x["id"]: x for x in r.json()["replicas"]}.get("phone-d")

    def page_rep():
        r = requests.get(admin + "/admin/v1/status", headers=ah, timeout=T(5))
        assert r.status_code == 200, r.text
        return {x["id"]: x for x in r.json()["replicas"]}.get("phone-d")

    def metrics():
        r = requests.get(admin + "/metrics", headers=ah, timeout=T(5))
        assert r.status_code == 200, r.text
        return fleet.parse_prometheus(r.text)

    def device(x):
        keys = ("battery_pct", "charging", "temperature_c", "mem_free_mb", "cpu_max_freq_ratio")
        return {k: x[k] for k in keys} if x else None

    first = {"battery_pct": 81, "charging": True, "temperature_c": 61.2, "mem_free_mb": 812,
             "cpu_max_freq_ratio": CPU_HALF_BIG}
    assert fleet.wait_until(lambda: device(rep()) == first, T(10)), rep()
    assert device(page_rep()) == first, page_rep()
    m = metrics()
    lbl = '{replica="phone-d"}'
    assert m["fleetgate_replica_battery_ratio" + lbl] == pytest.approx(0.81), m
    assert m["fleetgate_replica_temperature_celsius" + lbl] == pytest.approx(61.2)
    assert m["fleetgate_replica_cpu_max_freq_ratio" + lbl] == pytest.approx(CPU_HALF_BIG)
    assert m["fleetgate_replica_memory_available_bytes" + lbl] == 812 * 1048576

    # unplugged, cooler, no cap, less memory: the next readings (every few seconds) say so
    fake_phone(root, capacity="79", status="Discharging", cpu_temp="48500", big_cap="2841600",
               meminfo="MemTotal: 16000000 kB\nMemAvailable: 524288 kB\n")
    second = {"battery_pct": 79, "charging": False, "temperature_c": 55.0, "mem_free_mb": 512,
              "cpu_max_freq_ratio": 1}
    assert fleet.wait_until(lambda: device(rep()) == second, T(15)), rep()
    assert device(page_rep()) == second, page_rep()
    m = metrics()
    assert m["fleetgate_replica_battery_ratio" + lbl] == pytest.approx(0.79), m
    assert m["fleetgate_replica_cpu_max_freq_ratio" + lbl] == 1

    # no CPU zone: the battery's zone; a level that is garbage and no status: unknown
    fake_phone(root, capacity="lots", status=None, cpu_temp=None, big_cap="2841600",
               meminfo="MemTotal: 16000000 kB\nMemAvailable: 524288 kB\n")
    third = {"battery_pct": None, "charging": None, "temperature_c": 31.0, "mem_free_mb": 512,
             "cpu_max_freq_ratio": 1}
    assert fleet.wait_until(lambda: device(rep()) == third, T(15)), rep()
    m = metrics()
    assert "fleetgate_replica_battery_ratio" + lbl not in m, m
    assert m["fleetgate_replica_temperature_celsius" + lbl] == pytest.approx(31.0)


def test_gateway_moves_a_request_off_a_llama_phone_that_turned_slow(procs, gateway, tmp_path):
    """End to end through the real-engine path: the agent fronts llama-server (played by
    the sim, turned 5x slower than its configured rates) and reports progress read from
    its /slots; the gateway sees the prompt read at a fifth of the planned pace and moves
    the request to the other phone, which answers it."""
    plan = tmp_path / "slow.json"
    plan.write_text(json.dumps([{"at_s": 0, "kind": "slow", "dur_s": 100000}]))

    def argv(ports):
        # planned 400 prompt tokens/s (wall), reads at 80
        cfg = {"command": fleet.agent_bin(), "upstream": f"http://{HOST}:{ports[1]}",
               "args": sim_args(ports[1], slots=1, prefill_tps=40, decode_tps=50, time_scale=10,
                                extra=("--fault-plan", str(plan)))}
        path = tmp_path / "agent.json"
        path.write_text(json.dumps(cfg))
        return ["--engine", "llama", "--listen", f"{HOST}:{ports[0]}", "--config", path,
                "--id", "slowpoke"]

    slow = start_agent(procs, argv, n_ports=2, ready=engine_ready)
    steady = procs.spawn("steady", lambda ports: fleet.sim_argv(
        ports[0], slots=1, prefill_tps=30, decode_tps=50, time_scale=10, id="steady"))
    reps = [{"id": "slowpoke", "url": slow.url, "models": ["sim-model"], "slots": 1, "agent": True,
             "token_env": "FLEETGATE_REPLICA_TOKEN", "prefill_tps": 400, "decode_tps": 500},
            {"id": "steady", "url": steady.url, "models": ["sim-model"], "slots": 1, "agent": True,
             "prefill_tps": 300, "decode_tps": 500}]

    def cfg(ports):
        c = gw_config(ports[0], reps)
        c["health"]["interval_s"] = 0.3
        c["scheduler"]["expected_output_tokens"] = 8
        return c

    g = gateway(cfg, env=GW_ENV)
    assert fleet.wait_until(lambda: readyz(g) >= 2, T(10)), g.logs()
    prompt = " ".join(f"word{i}" for i in range(1000))  # ~2,000 tokens: 25 s on slowpoke, 7 on steady
    t0 = time.monotonic()
    r = requests.post(g.url + CHAT, json=fleet.chat_body(prompt, max_tokens=4), timeout=T(60))
    took = time.monotonic() - t0
    assert r.status_code == 200, r.text
    assert r.headers.get("x-fleetgate-replica") == "steady", r.headers
    logs = [json.loads(x) for x in Path(g.stderr_path).read_text().splitlines() if x.startswith("{")]
    moves = [x for x in logs if x.get("msg") == "routing" and x.get("decision") == "move"]
    assert len(moves) == 1 and moves[0]["replica"] == "slowpoke", moves
    assert moves[0]["prefill_tps"] < 200, moves[0]
    assert took < 18, took


def make_ca(d, name):
    """A throwaway CA in folder d and a certificate it signs for localhost/127.0.0.1."""
    def run(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", f"{name}-ca.key", "-out", f"{name}-ca.pem", "-days", "2", "-subj", f"/CN={name} CA")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", "/CN=localhost")
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{name}-ca.pem", "-CAkey", f"{name}-ca.key",
        "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", "san.ext")
    return d / f"{name}-ca.pem", d / f"{name}.pem", d / f"{name}.key"


def test_heartbeats_over_https_verify_the_gateway(procs, gateway, sim, tmp_path):
    """An https gateway with a private CA: an agent given that CA (--gateway-ca) joins; one
    trusting another CA does not, and says why. Heartbeats never skip verification."""
    ca, cert, key = make_ca(tmp_path, "gw")
    other_ca, _, _ = make_ca(tmp_path, "other")

    def config(ports):
        cfg = gw_config(ports[0])
        cfg["listen"].append({"address": f"{HOST}:{ports[1]}", "tls": {"cert": str(cert), "key": str(key)}})
        return cfg

    g = gateway(config, n_ports=2, env=GW_ENV)
    https = f"https://localhost:{g.ports[1]}"
    env = {"FLEETGATE_FLEET_SECRET": SECRET, "FLEETGATE_REPLICA_TOKEN": TOKEN}
    bad = procs.spawn("phone-bad", lambda ports: fleet.sim_argv(
        ports[0], slots=1, time_scale=10, id="phone-bad",
        extra_args=("--gateway", https, "--public-url", f"http://{HOST}:{ports[0]}", "--gateway-ca", str(other_ca))),
        env=env)
    procs.spawn("phone-tls", lambda ports: fleet.sim_argv(
        ports[0], slots=1, time_scale=10, id="phone-tls",
        extra_args=("--gateway", https, "--public-url", f"http://{HOST}:{ports[0]}", "--gateway-ca", str(ca))),
        env=env)
    assert fleet.wait_until(lambda: readyz(g) >= 1, T(10)), g.logs()
    r = requests.post(g.url + CHAT, json=fleet.chat_body("over tls heartbeats", max_tokens=2), timeout=T(15))
    assert r.status_code == 200 and r.headers.get("x-fleetgate-replica") == "phone-tls", (r.status_code, r.headers)
    assert fleet.wait_until(lambda: "certificate" in Path(bad.stderr_path).read_text().lower(), T(10)), \
        Path(bad.stderr_path).read_text()
    time.sleep(0.5)
    assert readyz(g) == 1, "the agent that cannot verify the gateway must not have joined"
    # A CA file that is not there is a start-up error, not a silent fallback.
    p = subprocess.run([fleet.agent_bin(), "--engine", "sim", "--listen", f"{HOST}:0", "--model", "m",
                        "--gateway", https, "--public-url", "http://127.0.0.1:1", "--gateway-ca",
                        str(tmp_path / "missing.pem")], env={**os.environ, **env}, capture_output=True,
                       text=True, timeout=T(10))
    assert p.returncode == 1 and "--gateway-ca" in p.stderr, (p.returncode, p.stderr)


def test_gateway_drain_reaches_the_agent(procs, gateway, sim):
    """The gateway's config lists the agent's id with "drain": true: the heartbeat reply
    says drain, and the agent refuses new work itself."""

    port = fleet.free_port()  # the replica entry names the agent's URL before it starts
    url = f"http://{HOST}:{port}"
    g = gateway(lambda ports: gw_config(ports[0], replicas=[
        {"id": "phone-d", "url": url, "models": ["sim-model"], "slots": 2,
         "token_env": "FLEETGATE_REPLICA_TOKEN", "drain": True, "agent": True, "heartbeats": True}]),
        env=GW_ENV)

    def argv(ports):
        ports[0] = port  # the port the gateway knows (ProcessGroup waits on this list)
        return fleet.sim_argv(port, slots=2, decode_tps=50, time_scale=10, id="phone-d",
                              extra_args=("--gateway", g.url, "--public-url", url))

    d = procs.spawn("phone", argv, env={"FLEETGATE_FLEET_SECRET": SECRET, "FLEETGATE_REPLICA_TOKEN": TOKEN})
    d.headers.update(AUTH)
    assert fleet.wait_until(lambda: status(d)["draining"], T(10)), (status(d), g.logs())
    r = chat(d, "refused", max_tokens=2)
    e = check_openai_error(r, 503, "draining sim")
    assert e["code"] == "draining"
