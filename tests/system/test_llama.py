"""The gateway in front of the real llama.cpp llama-server, in both releases the fleet may
mix: b10587 of August 2026 serving a tiny Qwen3.5 (hybrid, thinking) model
(shared/engines/llama-server-qwen35), today's engine, and the static build of 2025-02-20
serving a tiny llama-architecture model (shared/engines/llama-server), "an older phone".
Every test that is not about one release's behaviour runs against each (`[2025]`,
`[2026]`); bare engines from the config file and engines supervised by
`fleetgate-agent --engine llama`. Whole answers and streams, slots, prompt-cache reuse, a
client that leaves, an engine killed under load, requests the engine refuses (which must
not take phones out of rotation), OpenAI features passed through unchanged, and a fleet
of both releases behind one gateway.

The engines come from $FLEETGATE_LLAMA_SERVER_DIR and $FLEETGATE_LLAMA_SERVER_QWEN35_DIR,
or ../shared/engines/ beside the source tree, copied into the run's temporary folder.
Without them the tests skip, unless CI=true, where they fail."""

import concurrent.futures
import json
import os
import re
import signal
import socket
import threading
import time

from pathlib import Path

import pytest
import requests

import fleet
import gwutil as g
import llama
from fleet import HOST, T, read_sse, wait_until
from gwutil import CHAT, COMPLETIONS
from llama import MODEL

ADMIN_TOKEN = "llama-admin-token-0123456789"
ADMIN_ENV = "FLEETGATE_TEST_ADMIN_TOKEN"
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


# ---------------------------------------------------------------------------- fixtures

RELEASES = ["2025", "2026"]
# the tests about one release's behaviour say which
ONLY_2025 = pytest.mark.parametrize("engine", ["2025"], indirect=True)
ONLY_2026 = pytest.mark.parametrize("engine", ["2026"], indirect=True)


@pytest.fixture(scope="session")
def engine_of(tmp_path_factory):
    """engine_of(release): a private, runnable copy of that release's llama-server and
    model (once per run each). A release that cannot run skips the test, or fails it
    when CI=true."""
    made = {}

    def get(release):
        if release not in made:
            try:
                made[release] = llama.prepare(tmp_path_factory.mktemp(f"llama-server-{release}"), release=release)
            except llama.EngineMissing as e:
                made[release] = e
        got = made[release]
        if isinstance(got, llama.EngineMissing):
            if llama.in_ci():
                pytest.fail(f"CI=true and the real llama-server of {release} cannot run: {got}", pytrace=False)
            pytest.skip(f"real llama-server of {release} not available: {got}")
        return got
    return get


@pytest.fixture(params=RELEASES)
def engine(request, engine_of):
    """The engine of each release in turn (tests parametrized [2025], [2026])."""
    return engine_of(request.param)


@pytest.fixture
def engines(procs, engine):
    """Factory: engines(n, slots=2) starts n bare llama-servers. At the end of the test,
    one that died without the test killing it fails the test (their exit status cannot:
    this build aborts on SIGTERM)."""
    started = []

    def start(n=1, slots=2, **kw):
        out = [llama.start(procs, engine, name=f"llama{len(started) + i + 1}", slots=slots, **kw)
               for i in range(n)]
        for i, d in enumerate(out):
            d.id = f"l{len(started) + i + 1}"
        started.extend(out)
        return out

    yield start
    dead = [f"{d.name} (pid {d.pid}) exited with {d.proc.returncode}"
            for d in started if not d.alive() and not d.signalled]
    if dead:
        pytest.fail("llama-server died during the test: " + "; ".join(dead), pytrace=False)


@pytest.fixture
def agents(procs, engine, tmp_path):
    """Factory: agents(["a1", "a2"]) starts fleetgate-agent --engine llama for each id,
    each supervising its own llama-server."""
    def start(ids, slots=2, **kw):
        return [llama.start_agent(procs, engine, tmp_path, id, slots=slots, **kw) for id in ids]
    return start


# ---------------------------------------------------------------------------- helpers

class Gateway:
    """A started fleetgate (client listener ports[0], admin listener ports[1])."""

    def __init__(self, d):
        self.d = d
        self.url = d.url
        self.admin_url = f"http://{HOST}:{d.ports[1]}"

    def post(self, body, path=CHAT, timeout=None, **kw):
        return requests.post(self.url + path, json=body, timeout=timeout or T(30), **kw)

    def replicas(self):
        r = requests.get(self.admin_url + "/admin/v1/replicas", headers=ADMIN_AUTH, timeout=T(5))
        assert r.status_code == 200, r.text
        return {x["id"]: x for x in r.json()["replicas"]}

    def metrics(self):
        r = requests.get(self.admin_url + "/metrics", headers=ADMIN_AUTH, timeout=T(5))
        assert r.status_code == 200, r.text
        return fleet.parse_prometheus(r.text)

    def counter(self, name, **labels):
        """The sum of every sample of a counter whose labels include these."""
        want = [f'{k}="{v}"' for k, v in labels.items()]
        return sum(v for k, v in self.metrics().items()
                   if k.split("{")[0] == name and all(w in k for w in want))

    def drain(self, rid, on=True):
        r = requests.post(f"{self.admin_url}/admin/v1/replicas/{rid}/{'drain' if on else 'enable'}",
                          headers=ADMIN_AUTH, timeout=T(5))
        assert r.status_code == 200, r.text

    def state_changes(self, replica=None):
        """The gateway log's replica state changes, in order."""
        return [r for r in g.log_records(self.d) if r.get("msg") == "replica state changed"
                and (replica is None or r.get("replica") == replica)]


def bare_replica(d, **over):
    r = {"id": d.id, "url": d.url, "models": [MODEL], "slots": d.slots,
         "prefill_tps": 2000, "decode_tps": 500}
    r.update(over)
    return r


def agent_replica(d, **over):
    r = {"id": d.id, "url": d.url, "models": [MODEL], "slots": d.slots, "agent": True,
         "token_env": "FLEETGATE_REPLICA_TOKEN", "prefill_tps": 2000, "decode_tps": 500}
    r.update(over)
    return r


def start_gateway(gateway, replicas, health=None, **kw):
    """fleetgate with an admin listener in front of replicas, ready once /readyz counts
    every one of them ready."""
    def config(ports):
        cfg = g.gw_config(ports[0], replicas, health=dict({"interval_s": 0.3, "cooldown_s": 2},
                                                          **(health or {})), **kw)
        cfg["admin"] = {"listen": f"{HOST}:{ports[1]}", "token_env": ADMIN_ENV}
        return cfg

    n = len(replicas)
    d = gateway(config, n_ports=2, ready=lambda d: (g.replicas_ready(d) or 0) >= n, ready_timeout=20,
                env={ADMIN_ENV: ADMIN_TOKEN, "FLEETGATE_REPLICA_TOKEN": llama.TOKEN})
    return Gateway(d)


def cached_tokens(body):
    """Prompt tokens taken from the engine's cache: usage.prompt_tokens_details.cached_tokens
    (newer builds), timings.cache_n, or what the prompt had beyond the tokens computed."""
    details = (body.get("usage") or {}).get("prompt_tokens_details") or {}
    if "cached_tokens" in details:
        return details["cached_tokens"]
    t = body.get("timings") or {}
    if "cache_n" in t:
        return t["cache_n"]
    return body["usage"]["prompt_tokens"] - t["prompt_n"]


def answer_text(msg):
    """A chat message's (or delta's) generated text: its content, and its reasoning (b10587's
    thinking model writes all of it to reasoning_content, content "")."""
    return (msg.get("reasoning_content") or "") + (msg.get("content") or "")


def check_answer(r, max_tokens=None, replicas=None):
    """A 200 chat completion from llama-server through the gateway. Returns the body."""
    assert r.status_code == 200, (r.status_code, r.text[:500])
    assert r.headers.get("Content-Type", "").startswith("application/json"), r.headers
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == MODEL, body
    msg = body["choices"][0]["message"]
    assert msg["role"] == "assistant" and isinstance(msg["content"], str), body
    assert answer_text(msg), body
    u = body["usage"]
    assert u["prompt_tokens"] > 0 and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u
    if max_tokens is not None:
        assert u["completion_tokens"] == max_tokens, u
    t = body["timings"]
    assert t["predicted_n"] == u["completion_tokens"] and t["prompt_n"] >= 1, t
    assert r.headers.get("x-request-id"), r.headers
    if replicas is not None:
        assert r.headers.get("x-fleetgate-replica") in replicas, r.headers
    return body


def check_answer_text(text, max_tokens):
    """A chat completion body (text) with exactly max_tokens generated."""
    body = json.loads(text)
    assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] == max_tokens, body
    return body


def check_stream(res, n_tokens):
    """A whole stream from llama-server: role and text chunks (content, or b10587's
    reasoning_content), a finish chunk, usage and timings before [DONE] (the 2025 build puts
    them on the finish chunk; b10587 on a chunk of its own, with choices [])."""
    assert res.error is None and not res.timed_out, (res.error, res.data[-3:])
    assert res.done, res.data[-3:]
    chunks = res.chunks()
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == MODEL for c in chunks), chunks[:2]
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finish) == 1 and finish[0]["choices"][0]["finish_reason"] == "length", finish
    text = "".join(answer_text(c["choices"][0]["delta"]) for c in chunks if c["choices"])
    assert text, chunks
    usage = [c for c in chunks if c.get("usage")]
    assert usage and usage[-1] is chunks[-1], chunks[-2:]
    assert usage[-1]["usage"]["completion_tokens"] == n_tokens, usage[-1]
    assert usage[-1]["timings"]["predicted_n"] == n_tokens, usage[-1]
    return chunks


# Engines for long answers get the model's whole context per slot: 8,000 tokens take this
# build several seconds (the gateway refuses a cap that does not fit the slot's context).
LONG_CTX = 8192
LONG = 8000


def long_body(max_tokens=LONG, **kw):
    """A request that generates for a long time: no end of sequence, a large cap."""
    return dict(fleet.chat_body("write at length", model=MODEL, max_tokens=max_tokens, **kw), ignore_eos=True)


def decoded(slot):
    """Tokens a slot of /slots generated: next_token is an object in the 2025 build, a list
    (one per choice) in b10587."""
    nt = slot["next_token"]
    return (nt[0] if isinstance(nt, list) else nt)["n_decoded"]


def check_cancelled(url, log_path=None):
    """Every slot of the engine at url is idle, and the one that ran the long answer
    stopped short of its cap: it was cancelled, not finished. The 2025 build's /slots
    keeps the count a released slot decoded; b10587's shows 0 there, and its log says how
    many tokens the slot held when it stopped ("stop processing: n_tokens = N")."""
    ss = llama.slots(url)
    assert not any(x["is_processing"] for x in ss), ss
    ran = [x for x in ss if x.get("params", {}).get("n_predict") == LONG]
    assert ran, [(x["id"], x.get("params", {}).get("n_predict"), x.get("next_token")) for x in ss]
    if isinstance(ran[0]["next_token"], dict):
        assert all(0 < decoded(x) < LONG for x in ran), [(x["id"], x["next_token"]) for x in ran]
        return
    assert log_path, "b10587's slots say nothing of a cancel: its log is needed"
    stops = [int(m) for m in re.findall(r"stop processing: n_tokens = (\d+)", Path(log_path).read_text(errors="replace"))]
    assert stops and 0 < stops[-1] < LONG, stops[-5:]


class StateWatch:
    """Polls the gateway's admin API in a thread until stop(): every (time, replica,
    health, draining) it saw that was not a ready replica in rotation."""

    def __init__(self, gw, interval=0.1):
        self.gw = gw
        self.interval = interval
        self.bad = []
        self.seen = {}
        self.polls = 0
        self.errors = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        t0 = time.monotonic()
        while not self._stop.is_set():
            try:
                reps = self.gw.replicas()
            except Exception as e:  # noqa: BLE001 - reported by the test
                self.errors.append(repr(e))
                self._stop.wait(self.interval)
                continue
            self.polls += 1
            for rid, x in reps.items():
                self.seen.setdefault(rid, []).append(x["health"])
                if x["health"] != "ready" or x["draining"]:
                    self.bad.append((round(time.monotonic() - t0, 2), rid, x["health"], x["draining"],
                                     x["reason"]))
            self._stop.wait(self.interval)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join(T(10))


def open_stream(port, body, n_events=3, headers=None):
    """A raw client that sends a streamed request and reads until n_events arrived.
    Returns (socket, bytes read): the caller closes the socket to leave."""
    raw = fleet.http_request_bytes("POST", CHAT, body, headers=headers, port=port)
    got = b""
    s = socket.create_connection((HOST, port), timeout=T(10))
    s.sendall(raw)
    deadline = time.monotonic() + T(10)
    while got.count(b"data:") < n_events and time.monotonic() < deadline:
        if b"\r\n\r\n" in got and not got.startswith(b"HTTP/1.1 200"):
            s.settimeout(1)  # an error answer: read what is left of it, no more
        try:
            b = s.recv(65536)
        except socket.timeout:
            break
        if not b:
            break
        got += b
    return s, got


# ---------------------------------------------------------------------------- 1. bare engines

def test_bare_engines_whole_answers_and_streams(engine, engines, gateway):
    """Two llama-servers from the config file: chat and text completions whole, streams
    with and without include_usage; llama-server's usage and timings come through."""
    es = engines(2)
    gw = start_gateway(gateway, [bare_replica(d) for d in es])
    ids = {d.id for d in es}

    r = gw.post(dict(fleet.chat_body("Hello there", model=MODEL, max_tokens=8), ignore_eos=True),
                headers={"x-request-id": "whole-1"})
    body = check_answer(r, max_tokens=8, replicas=ids)
    assert r.headers["x-request-id"] == "whole-1", r.headers
    assert body["choices"][0]["finish_reason"] == "length", body

    r = gw.post({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 5, "ignore_eos": True},
                path=COMPLETIONS)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and isinstance(body["choices"][0]["text"], str), body
    assert body["usage"]["completion_tokens"] == 5 and body["timings"]["predicted_n"] == 5, body

    r = gw.post(dict(fleet.chat_body("Stream it", model=MODEL, max_tokens=6, stream=True, include_usage=True),
                     ignore_eos=True), stream=True)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream"), r.headers
    assert r.headers.get("x-fleetgate-replica") in ids, r.headers
    chunks = check_stream(read_sse(r), 6)
    # b10587 sends a role chunk first; the 2025 build's first chunk has content
    assert (chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}) == (engine.release == "2026"), \
        chunks[0]

    r = gw.post(dict(fleet.chat_body("No usage asked", model=MODEL, max_tokens=4, stream=True),
                     ignore_eos=True), stream=True)
    res = read_sse(r)
    assert res.done and not res.error, res.data[-3:]
    assert [c["choices"][0]["finish_reason"] for c in res.chunks() if c["choices"]][-1] == "length"


def test_gateway_learns_slots_from_props(engines, gateway):
    """Replicas declared without "slots": the gateway takes each one's slot count from
    llama-server's /props (total_slots, which is -np) and shows it in the admin API."""
    es = engines(1, slots=2) + engines(1, slots=3)
    for d in es:
        props = requests.get(d.url + "/props", timeout=T(5)).json()
        assert props["total_slots"] == d.slots, props
    reps = []
    for d in es:
        r = bare_replica(d)
        del r["slots"]
        reps.append(r)
    gw = start_gateway(gateway, reps)
    want = {d.id: d.slots for d in es}
    got = wait_until(lambda: (lambda s: s if s == want else None)(
        {rid: x["slots"] for rid, x in gw.replicas().items()}), T(5), interval=0.2)
    assert got == want, f"admin API slots {({rid: x['slots'] for rid, x in gw.replicas().items()})}, " \
                        f"llama-server /props total_slots {want}"


def test_repeated_prompt_reuses_the_engines_cache(engine, engines, gateway):
    """The same long prompt twice (another one between): the gateway sends it back to the
    phone that has it cached, and llama-server reuses the cached prefix (b10587's hybrid
    model all of it but the last 4 tokens: its checkpoint before the prompt's end)."""
    es = engines(2)
    # no rates configured: both engines are learned (the second from the fleet's prior
    # until it answers). Configured at 2,000 / 500, the engine not yet used looks faster
    # than the real one with the prompt cached, and takes the repeat: an operator's rates
    # are planned as given until answers correct them (docs/routing.md, exploration)
    gw = start_gateway(gateway, [{k: v for k, v in bare_replica(d).items()
                                  if k not in ("prefill_tps", "decode_tps")} for d in es])
    # ~1,200 tokens with either vocabulary (the 2025 model's makes ~4 of each estimated
    # token, Qwen3.5's split of GPT-2's vocabulary ~1.3)
    prompt = fleet.make_prompt(400 if engine.release == "2025" else 900, tag="cached")
    first = check_answer(gw.post(fleet.chat_body(prompt, model=MODEL, max_tokens=4)))
    for attempt in range(2):
        r1 = gw.post(fleet.chat_body(prompt + f" #{attempt}", model=MODEL, max_tokens=4))
        check_answer(r1)
        where = r1.headers["x-fleetgate-replica"]
        other = check_answer(gw.post(fleet.chat_body(fleet.make_prompt(300 if engine.release == "2025" else 700,
                                                                       tag=f"other{attempt}"),
                                                     model=MODEL, max_tokens=4)))
        r2 = gw.post(fleet.chat_body(prompt + f" #{attempt}", model=MODEL, max_tokens=4))
        second = check_answer(r2)
        assert r2.headers["x-fleetgate-replica"] == where, (r1.headers, r2.headers)
        n = second["usage"]["prompt_tokens"]
        assert n > 800, second["usage"]
        assert cached_tokens(second) >= 0.9 * n, (second["usage"], second["timings"])
        assert second["timings"]["prompt_n"] < 0.1 * n, second["timings"]
        # the gateway's own record counts the cached tokens too (this build says only how
        # many it evaluated: prompt_n), which is what its learning of prefill rates uses
        rec = g.access_log(gw.d, r2.headers["x-request-id"])
        assert rec["cached_tokens"] == n - second["timings"]["prompt_n"], (rec, second["timings"])
    assert cached_tokens(first) < 0.5 * first["usage"]["prompt_tokens"], first
    assert cached_tokens(other) < 0.5 * other["usage"]["prompt_tokens"], other
    # llama-server is honest, and its tokenizer makes ~4 tokens of each estimated one:
    # prefill is learned in the gateway's own tokens, so the clock check agrees with it
    # (learned in its tokens, it was called a liar and learned 4x slow: this test's flake)
    assert not g.log_msgs(gw.d, "timings disagreed: learned from the gateway's clock"), \
        g.log_msgs(gw.d, "timings disagreed: learned from the gateway's clock")


def test_client_that_leaves_mid_stream_frees_the_engines_slot(engines, gateway):
    """A streamed answer of 8,000 tokens: the client reads a few chunks and closes its
    connection; llama-server's slot stops within seconds, short of the 8,000."""
    es = engines(2, ctx_per_slot=LONG_CTX)
    gw = start_gateway(gateway, [bare_replica(d) for d in es])
    sock, got = open_stream(gw.d.port, long_body(stream=True), n_events=20)
    try:
        assert got.startswith(b"HTTP/1.1 200") and got.count(b"data:") >= 20, got[:600]
        busy = wait_until(lambda: sum(llama.processing(d.url) for d in es) == 1, T(10), interval=0.1)
        assert busy, [llama.slots(d.url) for d in es]
    finally:
        sock.close()
    t0 = time.monotonic()
    freed = wait_until(lambda: sum(llama.processing(d.url) for d in es) == 0, T(10), interval=0.1)
    assert freed, ("a slot still processing 10 s after the client left",
                   [[s for s in llama.slots(d.url) if s["is_processing"]] for d in es])
    assert time.monotonic() - t0 < T(10)
    ran = [d for d in es if any(x.get("params", {}).get("n_predict") == LONG for x in llama.slots(d.url))]
    assert len(ran) == 1, [llama.slots(d.url) for d in es]
    check_cancelled(ran[0].url, ran[0].stderr_path)
    check_answer(gw.post(fleet.chat_body("after", model=MODEL, max_tokens=2)))


# ---------------------------------------------------------------------------- 2. agents

def test_agents_whole_answers_streams_and_slots(agents, gateway):
    """Two agents each supervising a llama-server: their status shows the engine's slots,
    context and model (from /props and /v1/models), answers and streams pass through
    gateway → agent → llama-server, and a running request shows as a busy slot."""
    ags = agents(["a1", "a2"], ctx_per_slot=LONG_CTX)
    for d in ags:
        st = llama.status(d)
        assert st["engine"] == "llama" and st["engine_state"] == "ready", st
        assert st["slots"] == 2 and st["n_ctx"] == LONG_CTX and st["models"] == [MODEL], st
        assert isinstance(st["engine_pid"], int) and llama.parent_pid(st["engine_pid"]) == d.pid, st
    gw = start_gateway(gateway, [agent_replica(d) for d in ags])
    ids = {"a1", "a2"}

    check_answer(gw.post(dict(fleet.chat_body("Hello agent", model=MODEL, max_tokens=7), ignore_eos=True)),
                 max_tokens=7, replicas=ids)
    # greedy: sampled, the tiny model once gave 6 tokens of no text (a CI run under ASan)
    r = gw.post(dict(fleet.chat_body("Stream through the agent", model=MODEL, max_tokens=6, stream=True,
                                     include_usage=True), ignore_eos=True, temperature=0), stream=True)
    assert r.status_code == 200 and r.headers.get("x-fleetgate-replica") in ids, (r.status_code, r.headers)
    check_stream(read_sse(r), 6)

    # a long stream: the serving agent counts one busy slot and lists its progress
    sock, got = open_stream(gw.d.port, long_body(stream=True), n_events=5,
                            headers={"x-request-id": "long-through-agent"})
    try:
        head = got.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()
        assert head.startswith("http/1.1 200") and got.count(b"data:") >= 5, got[:600]
        serving = next((d for d in ags if f"x-fleetgate-replica: {d.id}" in head), None)
        assert serving, head

        def running():
            st = llama.status(serving)
            return st["busy"] == 1 and [x for x in st["running"] if x["request_id"] == "long-through-agent"] and st

        st = wait_until(running, T(5), interval=0.2)
        assert st, llama.status(serving)
    finally:
        sock.close()
    assert wait_until(lambda: llama.status(serving)["busy"] == 0, T(5)), llama.status(serving)
    assert wait_until(lambda: llama.processing(serving.engine_url) == 0, T(10)), llama.slots(serving.engine_url)
    check_cancelled(serving.engine_url, serving.stderr_path)  # the agent's stderr has its engine's


def test_the_engines_own_endpoints_stay_behind_the_agent(agents):
    """The real llama-server answers /slots, /props and slot actions to whoever reaches
    it; through the agent, none of them (and no traversal to them) gets there, while the
    OpenAI calls do. The agent's relay counter shows that nothing was forwarded."""
    (d,) = agents(["guard"], slots=1)
    assert requests.get(d.engine_url + "/slots", timeout=T(5)).status_code == 200  # what is at stake
    assert requests.get(d.engine_url + "/props", timeout=T(5)).status_code == 200
    before = llama.status(d)["requests"]
    for method, target, want in (("GET", "/slots", 404), ("GET", "/props", 404), ("GET", "/metrics", 404),
                                 ("GET", "/v1/../slots", 400), ("POST", "/v1/../slots/0?action=save", 400),
                                 ("POST", "/slots/0?action=erase", 404), ("GET", "/v1/%2e%2e/props", 400),
                                 ("GET", "/v1//models", 400), ("POST", "/v1/chat/completions/../../props", 400),
                                 ("GET", "/v1/chat/completions", 405), ("POST", "/v1/chat/completions?x=1", 400)):
        with socket.create_connection((HOST, d.ports[0]), timeout=T(10)) as sock:
            sock.sendall(f"{method} {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {llama.TOKEN}\r\n"
                         f"Content-Length: 2\r\nConnection: close\r\n\r\n{{}}".encode())
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        status = int(data.split(b" ", 2)[1])
        assert status == want, (method, target, data[:300])
        assert b'"error"' in data and b"n_ctx" not in data, (method, target, data[:300])
    assert llama.status(d)["requests"] == before, "something was relayed to the engine"
    r = d.post(CHAT, json=dict(fleet.chat_body("hi", model=MODEL, max_tokens=3)), timeout=T(60))
    assert r.status_code == 200, r.text
    assert d.get("/v1/models").json()["data"][0]["id"] == MODEL
    assert llama.status(d)["requests"] == before + 2


def test_engine_killed_under_load(agents, gateway):
    """While 14 requests are in flight over two agents, SIGKILL one agent's llama-server.
    The agent restarts it; the gateway takes that phone out and brings it back; every
    request gets an answer (most a 200, any other an explicit error), none hangs."""
    ags = agents(["a1", "a2"])
    gw = start_gateway(gateway, [agent_replica(d) for d in ags], scheduler={"retries": 3})
    victim = ags[0]
    old_pid = llama.status(victim)["engine_pid"]
    assert llama.parent_pid(old_pid) == victim.pid, (old_pid, victim.pid)

    n_whole, n_stream = 10, 4
    results = {}

    def whole(i):
        try:
            r = gw.post(dict(fleet.chat_body(f"load {i}", model=MODEL, max_tokens=1500), ignore_eos=True),
                        timeout=T(60), headers={"x-request-id": f"whole-{i}"})
            results[f"whole-{i}"] = ("whole", r.status_code, r.text)
        except requests.RequestException as e:
            results[f"whole-{i}"] = ("whole", None, repr(e))

    def stream(i):
        try:
            r = gw.post(dict(fleet.chat_body(f"stream {i}", model=MODEL, max_tokens=1500, stream=True),
                             ignore_eos=True), stream=True, timeout=T(60), headers={"x-request-id": f"stream-{i}"})
            if r.status_code != 200:
                results[f"stream-{i}"] = ("stream", r.status_code, r.text)
                return
            results[f"stream-{i}"] = ("stream", 200, read_sse(r, timeout=T(60)))
        except requests.RequestException as e:
            results[f"stream-{i}"] = ("stream", None, repr(e))

    threads = [threading.Thread(target=whole, args=(i,), daemon=True) for i in range(n_whole)]
    threads += [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(n_stream)]
    t0 = time.monotonic()
    with StateWatch(gw) as watch:
        for t in threads:
            t.start()
        assert wait_until(lambda: llama.status(victim)["busy"] == 2, T(10), interval=0.05), llama.status(victim)
        os.kill(old_pid, signal.SIGKILL)
        for t in threads:
            t.join(max(0.1, T(90) - (time.monotonic() - t0)))
        hung = [t for t in threads if t.is_alive()]
        back = wait_until(lambda: gw.replicas()["a1"]["health"] == "ready", T(30), interval=0.2)
    took = time.monotonic() - t0
    assert not hung, f"{len(hung)} requests still unanswered after {took:.0f} s"

    ok, errors = 0, []
    for rid, (kind, status, payload) in sorted(results.items()):
        if status is None:
            errors.append((rid, "no answer", payload))
        elif kind == "whole" and status == 200:
            check_answer_text(payload, 1500)
            ok += 1
        elif kind == "stream" and status == 200:
            if payload.done:
                ok += 1
            else:  # broken off after it started: one explicit error event, no [DONE]
                last = json.loads(payload.data[-1]) if payload.data else {}
                assert "error" in last, (rid, payload.error, payload.data[-2:])
                errors.append((rid, "stream error event", last["error"].get("code")))
        else:
            e = g.check_error_body(payload, status, what=rid)
            errors.append((rid, status, e["code"]))
    assert len(results) == n_whole + n_stream
    assert not [e for e in errors if e[1] == "no answer"], errors
    assert ok >= (n_whole + n_stream) * 3 // 4, (ok, errors)

    st = llama.status(victim)
    assert st["engine_restarts"] >= 1 and st["engine_pid"] != old_pid, st
    assert llama.parent_pid(st["engine_pid"]) == victim.pid, st
    assert back, (gw.replicas()["a1"], watch.bad[-5:])
    out = [x for x in watch.bad if x[1] == "a1" and x[2] in ("loading", "down")]
    changes = [(c["from"], c["to"]) for c in gw.state_changes("a1")]
    assert out or any(to in ("loading", "down") for _, to in changes), (watch.seen.get("a1"), changes)
    assert changes and changes[-1][1] == "ready", changes
    # both phones serve again
    for i in range(4):
        check_answer(gw.post(fleet.chat_body(f"after the kill {i}", model=MODEL, max_tokens=4)))


def test_busy_engines_answer_their_health_checks_on_time(engine, engines, agents, gateway):
    """A phone with work on it is checked every health.busy_interval_s, and a check
    unanswered after health.late_s makes it suspect (its waiting requests hedge). The
    real llama-server answers /health from its HTTP threads while every slot decodes and
    more requests wait in its own queue, and the agent answers its status from its own
    loop while it relays: under that load neither engine is ever suspect, no check is
    late and nothing is hedged for a check, although the bare engine is checked many times."""
    bare = engines(1, ctx_per_slot=LONG_CTX)[0]
    ag = agents(["a1"], ctx_per_slot=LONG_CTX)[0]
    # late_s 1: an engine that answered /health only between its decoding steps' batches
    # would be late by seconds (each answer here decodes 3,000 tokens); a loaded CI machine
    # (two other system tests beside it) once kept a check 0.25 s
    gw = start_gateway(gateway, [bare_replica(bare), agent_replica(ag)],
                       health={"interval_s": 30, "busy_interval_s": 0.1, "late_s": 1.0,
                               "timeout_s": 5})
    health_before = Path(bare.stderr_path).read_text(errors="replace").count("GET /health")
    n = 8  # two rounds on the four slots: the engines queue the rest themselves
    with concurrent.futures.ThreadPoolExecutor(max_workers=n) as ex:
        futs = [ex.submit(gw.post, long_body(max_tokens=3000), timeout=T(120)) for _ in range(n)]
        suspect, busy_polls = set(), 0
        while not all(f.done() for f in futs):
            for rid, x in gw.replicas().items():
                if x["suspect"]:
                    suspect.add(rid)
                busy_polls += x["slots_busy"] > 0
            time.sleep(0.05)
        results = [f.result() for f in futs]
    for r in results:
        check_answer(r, max_tokens=3000)
    assert busy_polls > 0
    assert not suspect, suspect
    assert not g.log_msgs(gw.d, "health check late: replica suspect")
    # hedges for a first byte overdue by the prediction may happen (the tiny model's pace
    # is not the configured one); none for a health check
    why = [x.get("why") for x in g.log_records(gw.d) if x.get("msg") == "routing" and x.get("why")]
    assert not why, why
    checks = Path(bare.stderr_path).read_text(errors="replace").count("GET /health") - health_before
    if engine.release == "2025":  # (b10587 logs no request line, at any verbosity)
        assert checks >= 5, checks  # every ~0.1 s while it worked, not every 30 s
    for x in gw.replicas().values():
        assert x["health"] == "ready" and x["probe_s"] is not None and x["probe_s"] < 1.0, x


# ---------------------------------------------------------------------------- 3. refused requests

# llama-server answers these with 500 server_error (captures in tests/system/fixtures/)
TOOL_NO_DESCRIPTION = [{"type": "function", "function": {
    "name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}]
# a valid tool; this build still answers 500 to tools in a streamed request
TOOL = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def bad_tools(**kw):
    return dict(fleet.chat_body("what is the weather?", model=MODEL, max_tokens=8), tools=TOOL_NO_DESCRIPTION, **kw)


def bad_n2():
    return dict(fleet.chat_body("two answers please", model=MODEL, max_tokens=8), n=2)


def bad_content():
    return {"model": MODEL, "messages": [{"role": "user", "content": 42}], "max_tokens": 8}


def bad_schema(**kw):
    """A tool whose parameters are no JSON schema: b10587 answers 400 "JSON schema
    conversion failed" (tools-bad-type.http)."""
    return dict(fleet.chat_body("what is the weather?", model=MODEL, max_tokens=8),
                tools=[{"type": "function", "function": {"name": "f", "description": "d", "parameters": {
                    "type": "object", "properties": {"city": {"type": "nonsense"}}, "required": ["city"]}}}], **kw)


def bad_ref(**kw):
    """A schema with a dangling $ref: b10587's 400 too (tools-bad-ref.http)."""
    return dict(fleet.chat_body("what is the weather?", model=MODEL, max_tokens=8),
                tools=[{"type": "function", "function": {"name": "f", "description": "d", "parameters": {
                    "type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}}}], **kw)


# what each release refuses: the 2025 build with 500 server_error, b10587 with 400
BAD = {"tools": bad_tools, "n2": bad_n2, "content": bad_content}
BAD_2026 = {"schema": bad_schema, "ref": bad_ref, "content": bad_content}
BAD_BY_RELEASE = {"2025": BAD, "2026": BAD_2026}


def post_refused(gw, body):
    """(response or None, seconds): a request the contract wants answered within 5 s;
    None when nothing came in 10."""
    t0 = time.monotonic()
    try:
        r = gw.post(body, timeout=T(10))
    except requests.RequestException:
        r = None
    return r, time.monotonic() - t0


def refusal_problems(r, kind, took):
    """What is wrong with the answer to a request llama-server refuses with 500, by the
    contract: a 400 within 5 s in OpenAI's shape, type invalid_request_error; for tools,
    llama-server's own text and code request_refused. [] when it is right."""
    if r is None:
        return [f"{kind}: no answer within {took:.0f} s"]
    out = []
    if took >= T(5):
        out.append(f"{kind}: answered after {took:.1f} s")
    try:
        e = g.check_error(r, 400, what=f"{kind}")
    except AssertionError as err:
        return out + [str(err)]
    if e["type"] != "invalid_request_error":
        out.append(f"{kind}: type {e['type']!r}: {e}")
    if kind == "tools" and not ("Failed to parse tools" in e["message"] and e["code"] == "request_refused"):
        out.append(f"{kind}: wanted llama-server's text and code request_refused: {e}")
    if kind.startswith(("schema", "ref")) and not ("JSON schema conversion failed" in e["message"]
                                                   and e["code"] == "request_refused"):
        out.append(f"{kind}: wanted b10587's text and code request_refused: {e}")
    return out


@ONLY_2025
def test_engine_refuses_these_requests_with_500(engines):
    """The premise of the tests below, checked against the engine itself: the 2025
    llama-server answers each bad request with 500 server_error and keeps serving."""
    d, = engines(1)
    for kind, make in BAD.items():
        r = requests.post(d.url + CHAT, json=make(), timeout=T(10))
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error", (kind, r.status_code, r.text)
    assert "Failed to parse tools" in requests.post(d.url + CHAT, json=bad_tools(), timeout=T(10)).text
    assert requests.get(d.url + "/health", timeout=T(5)).status_code == 200


@ONLY_2026
def test_engine_refuses_these_requests_with_400(engines):
    """The same premise for b10587: it answers these with 400 invalid_request_error, and
    serves what the 2025 build refused ("n": 2, tools without a description)."""
    d, = engines(1)
    for kind, make in BAD_2026.items():
        r = requests.post(d.url + CHAT, json=make(), timeout=T(10))
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", (kind, r.text)
    for kind in ("n2", "tools"):
        r = requests.post(d.url + CHAT, json=BAD[kind](), timeout=T(10))
        assert r.status_code == 200, (kind, r.status_code, r.text[:300])
    assert len(requests.post(d.url + CHAT, json=bad_n2(), timeout=T(10)).json()["choices"]) == 2
    assert requests.get(d.url + "/health", timeout=T(5)).status_code == 200


def test_refused_requests_get_400_and_no_replica_leaves_rotation(engine, engines, gateway):
    """Each kind of request the engine refuses (2025: tools without a description, n: 2, a
    number as content; streamed: n: 2, and any tools; b10587: a broken tool schema, a
    dangling $ref, a number as content, streamed too): a 400 within 5 s, the fleet stays
    ready, no upstream failure is counted and refusals are."""
    es = engines(2)
    gw = start_gateway(gateway, [bare_replica(d) for d in es])
    failures0 = gw.counter("fleetgate_upstream_failures_total")
    refusals0 = gw.counter("fleetgate_request_refusals_total")
    if engine.release == "2025":
        cases = [("tools", bad_tools()), ("n2", bad_n2()), ("content", bad_content()),
                 ("n2 streamed", dict(bad_n2(), stream=True)),
                 # valid for OpenAI, but this build answers 500 "Cannot use tools with stream"
                 ("tools streamed", dict(fleet.chat_body("weather?", model=MODEL, max_tokens=8, stream=True),
                                         tools=TOOL))]
    else:
        cases = [("schema", bad_schema()), ("ref", bad_ref()), ("content", bad_content()),
                 ("schema streamed", bad_schema(stream=True)), ("content streamed", dict(bad_content(), stream=True))]
    problems = []
    with StateWatch(gw) as watch:
        for kind, body in cases:
            r, took = post_refused(gw, body)
            problems += refusal_problems(r, kind, took)
        check_answer(gw.post(fleet.chat_body("still fine", model=MODEL, max_tokens=3)))
    assert watch.polls > 0
    if watch.bad:
        problems.append(f"replicas out of rotation: {watch.bad[:3]}")
    failures = gw.counter("fleetgate_upstream_failures_total") - failures0
    if failures:
        problems.append(f"fleetgate_upstream_failures_total grew by {failures:.0f}")
    refusals = gw.counter("fleetgate_request_refusals_total") - refusals0
    by_code = gw.counter("fleetgate_request_refusals_total", code="request_refused")
    if refusals < 2 or by_code < 2:
        problems.append(f"fleetgate_request_refusals_total grew by {refusals:.0f} "
                        f"({by_code:.0f} with code request_refused), wanted >= 2 for the tools requests")
    assert not problems, "\n".join(problems)


@ONLY_2026
def test_the_engines_context_and_late_errors_are_judged_as_what_they_are(engines, gateway):
    """b10587's own answers (tests/system/fixtures/context-*-b10587.http, unparsable-*): a
    prompt past its context is OpenAI's context_length_exceeded with the engine's numbers,
    whole and streamed (b10587 answers both with plain JSON); an output it cannot read back
    (token 127 is a lone 0xC3 byte) is written again on the second engine and, the same
    there, is the request's 400, not the engines' failure."""
    es = engines(2)
    # the entries claim more context than the engines have (2,048 a slot), so the prompt
    # gets past the gateway's own estimate to the engine; every answer counts as late
    gw = start_gateway(gateway, [bare_replica(d, n_ctx=65536) for d in es],
                       upstream={"refusal_window_s": 0.001})
    failures0 = gw.counter("fleetgate_upstream_failures_total")
    words = " ".join(f"word{i}" for i in range(3000))
    for stream in (False, True):
        r = gw.post(fleet.chat_body(words, model=MODEL, max_tokens=8, stream=stream), stream=stream)
        e = g.check_error(r, 400, code="context_length_exceeded", what=f"stream={stream}")
        assert e["param"] == "messages", e
        m = re.fullmatch(r"This model's maximum context length is 2048 tokens\. However, your messages "
                         r"resulted in (\d+) tokens\. Please reduce the length of the messages\.", e["message"])
        assert m and int(m.group(1)) > 3000, e
    body = dict(fleet.chat_body("x", model=MODEL, max_tokens=6), temperature=0, logit_bias={"127": 100})
    r = gw.post(body)
    e = g.check_error(r, 400, code="model_output_unparsable")
    assert "does not match the expected" in e["message"], e
    assert gw.counter("fleetgate_request_refusals_total", code="model_output_unparsable") == 1
    assert gw.counter("fleetgate_upstream_failures_total") == failures0
    reps = gw.replicas()
    assert all(x["state"] in ("ready", "busy") and x["failures"] == 0 for x in reps.values()), reps  # busy: not charged


def test_the_openai_clients_responses_api(engine, engines, gateway):
    """client.responses.create of the official openai npm client, whole and streamed,
    through the gateway to the real engine (a chat completion to it; b10587 thinks, so its
    answer is mostly a reasoning item), and previous_response_id refused in OpenAI's shape."""
    from test_responses import check_node, node_responses  # noqa: PLC0415
    d, = engines(1)
    gw = start_gateway(gateway, [bare_replica(d)])
    res = node_responses(gw.url, MODEL)
    check_node(res, thinking=engine.release == "2026")
    if engine.release == "2026":
        assert res["stream"]["reasoning"], res["stream"]
        assert "reasoning" in res["whole"]["output_types"], res["whole"]


def test_refused_requests_amid_load_on_three_engines(engine, engines, gateway):
    """Three llama-servers, 30 ordinary requests in flight and, meanwhile, 6 that the
    engine refuses (2 of each kind): each refused one gets its 400 within 5 s, all 30
    ordinary ones succeed, and no replica leaves "ready" at any point."""
    es = engines(3)
    gw = start_gateway(gateway, [bare_replica(d) for d in es])
    failures0 = gw.counter("fleetgate_upstream_failures_total")
    n_ok = 30
    bad = [(kind, make()) for kind, make in BAD_BY_RELEASE[engine.release].items()] * 2

    def ordinary(i):
        r = gw.post(dict(fleet.chat_body(f"ordinary request {i}", model=MODEL, max_tokens=300), ignore_eos=True),
                    timeout=T(60))
        return r.status_code, r.text

    def refused(kind, body):
        return (kind, *post_refused(gw, body))

    with StateWatch(gw) as watch, concurrent.futures.ThreadPoolExecutor(max_workers=n_ok + len(bad)) as ex:
        oks = [ex.submit(ordinary, i) for i in range(n_ok)]
        # the bad ones arrive while the fleet is busy with the ordinary ones
        assert wait_until(lambda: sum(x["slots_busy"] for x in gw.replicas().values()) >= 4, T(10),
                          interval=0.05), gw.replicas()
        bads = [ex.submit(refused, kind, body) for kind, body in bad]
        bad_results = [f.result(timeout=T(60)) for f in bads]
        ok_results = [f.result(timeout=T(120)) for f in oks]
    problems = []
    for kind, r, took in bad_results:
        problems += refusal_problems(r, kind, took)
    failed = [(i, status, text[:200]) for i, (status, text) in enumerate(ok_results) if status != 200]
    if failed:
        problems.append(f"{len(failed)} of {n_ok} ordinary requests failed, e.g. {failed[:2]}")
    for status, text in ok_results:
        if status == 200:
            check_answer_text(text, 300)
    assert watch.polls > 0
    changes = [(c["replica"], c["to"], c["reason"]) for c in gw.state_changes() if c.get("to") != "ready"]
    if watch.bad or changes:
        problems.append(f"replicas left ready: {len(changes)} state changes, e.g. {changes[:3]}; "
                        f"seen by the admin API: {watch.bad[:3]}")
    failures = gw.counter("fleetgate_upstream_failures_total") - failures0
    if failures:
        problems.append(f"fleetgate_upstream_failures_total grew by {failures:.0f}")
    assert not problems, "\n".join(problems)


def test_refused_requests_through_agents(engine, agents, gateway):
    """The agent passes llama-server's refusal on as it is (the 2025 build's 500, b10587's
    400): through agents too, a refused request gets its 400 within 5 s and neither phone
    leaves rotation."""
    ags = agents(["a1", "a2"])
    gw = start_gateway(gateway, [agent_replica(d) for d in ags])
    first = "tools" if engine.release == "2025" else "schema"
    bad = BAD_BY_RELEASE[engine.release]
    direct = requests.post(ags[0].url + CHAT, json=bad[first](), headers=ags[0].headers, timeout=T(10))
    if engine.release == "2025":
        assert direct.status_code == 500 and "Failed to parse tools" in direct.text, direct.text
    else:
        assert direct.status_code == 400 and "JSON schema conversion failed" in direct.text, direct.text
    failures0 = gw.counter("fleetgate_upstream_failures_total")
    problems = []
    with StateWatch(gw) as watch:
        for kind in list(bad)[:2] * 2:
            r, took = post_refused(gw, bad[kind]())
            problems += refusal_problems(r, kind, took)
        check_answer(gw.post(fleet.chat_body("still fine", model=MODEL, max_tokens=3)))
    if watch.bad:
        problems.append(f"replicas out of rotation: {watch.bad[:3]}")
    failures = gw.counter("fleetgate_upstream_failures_total") - failures0
    if failures:
        problems.append(f"fleetgate_upstream_failures_total grew by {failures:.0f}")
    assert all(llama.status(d)["engine_state"] == "ready" for d in ags)
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------- OpenAI features

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
FEATURES = {
    "tools": {"tools": TOOL, "tool_choice": "required", "max_tokens": 64},
    # OpenAI's form; this build of llama-server ignores it (it came to llama.cpp later)
    "json_schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}},
                    "max_tokens": 16},
    # the form this build constrains its output with
    "json_object": {"response_format": {"type": "json_object", "schema": SCHEMA}, "max_tokens": 48},
    "logprobs": {"logprobs": True, "top_logprobs": 2, "max_tokens": 6},
    "stop": {"stop": [" of"], "max_tokens": 16},
    # sampled, not greedy: only the same seed gives the same text
    "seed": {"temperature": 0.9, "seed": 7, "max_tokens": 24},
}


def test_openai_features_pass_through_to_the_engine(engine, engines, gateway):
    """tools with tool_choice, response_format (json_schema, and json_object with a
    schema), logprobs with top_logprobs, stop: the gateway's answer equals llama-server's
    own for the same request (same seed, temperature 0, no prompt cache), fields and
    content. b10587's model is asked without thinking (chat_template_kwargs, which goes
    through as it is), so that its grammars shape the content."""
    d, = engines(1)
    gw = start_gateway(gateway, [bare_replica(d)])
    r26 = engine.release == "2026"
    for name, extra in FEATURES.items():
        body = dict(dict(fleet.chat_body(f"Tell me about {name}", model=MODEL), temperature=0, seed=42,
                         cache_prompt=False), **extra)
        if r26:
            body["chat_template_kwargs"] = {"enable_thinking": False}
        direct = requests.post(d.url + CHAT, json=body, timeout=T(30))
        via = gw.post(body)
        assert direct.status_code == 200, (name, direct.text[:300])
        assert via.status_code == 200, (name, via.status_code, via.text[:300])
        a, b = direct.json(), via.json()
        ca, cb = a["choices"][0], b["choices"][0]
        assert set(b) == set(a) and set(cb) == set(ca) and set(cb["message"]) == set(ca["message"]), (name, a, b)
        assert cb["message"] == ca["message"] and cb["finish_reason"] == ca["finish_reason"], (name, ca, cb)
        assert b["usage"] == a["usage"], (name, a["usage"], b["usage"])
        if name == "logprobs":
            lp = cb["logprobs"]["content"]
            assert len(lp) == b["usage"]["completion_tokens"] and all(len(x["top_logprobs"]) == 2 for x in lp), lp
            # the same tokens; their logprobs as the engine computed them this time (two runs
            # of one request may differ in the 7th digit: the engine's float sums)
            def same(x, y):
                return ({k: v for k, v in x.items() if k not in ("logprob", "top_logprobs")} ==
                        {k: v for k, v in y.items() if k not in ("logprob", "top_logprobs")} and
                        abs(x["logprob"] - y["logprob"]) < 1e-3)
            want = ca["logprobs"]["content"]
            assert len(lp) == len(want) and all(
                same(x, y) and len(x["top_logprobs"]) == len(y["top_logprobs"]) and
                all(same(u, v) for u, v in zip(x["top_logprobs"], y["top_logprobs"]))
                for x, y in zip(lp, want)), (ca["logprobs"], cb["logprobs"])
        if name == "json_object":  # the grammar held: an object with "n", whole
            assert cb["finish_reason"] == "stop" and isinstance(json.loads(cb["message"]["content"])["n"], int), cb
        if name == "json_schema" and r26:  # OpenAI's form constrains b10587's output too
            assert cb["message"]["content"].lstrip().startswith('{"n"'), cb
        if name == "seed":  # and another seed gives another text: the seed went through
            other = requests.post(d.url + CHAT, json=dict(body, seed=8), timeout=T(30)).json()
            assert other["choices"][0]["message"] != ca["message"], (other, ca)
        if r26:
            assert "reasoning_content" not in cb["message"], cb  # thinking was turned off
            continue
        # the 2025 build's template and grammars:
        if name == "tools":  # the tool-call grammar held
            assert '"name"\n:\n "get_weather"' in cb["message"]["content"], cb
        if name == "stop":  # it stopped at " of" (which the text has without stop)
            assert cb["finish_reason"] == "stop" and " of" not in cb["message"]["content"], cb


def test_a_batch_on_the_real_engine(agents, gateway, tmp_path):
    """A batch through the agent and the real llama-server: lines sharing a system prompt
    are answered, the batch's usage counts the prompt tokens the engine took from its cache
    (the 2025 build reports neither prompt_tokens_details nor timings.cache_n: the gateway
    counts what it evaluated; b10587 says it, reusing the system prompt up to its
    checkpoint at the user message), and a line too long for the engine's context is
    answered 400 into the error file."""
    import test_batch as tb
    (a,) = agents(["batch-1"])
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    gw = start_gateway(gateway, [agent_replica(a)], data_dir=str(data_dir))
    sysp = "You review transactions for fraud. Answer RISK_LEVEL: N. " * 20
    lines = [tb.line(f"r{i}", max_tokens=8, model=MODEL,
                     messages=[{"role": "system", "content": sysp},
                               {"role": "user", "content": f"transaction {i}"}]) for i in range(6)]
    lines.append(tb.line("too-long", max_tokens=8, model=MODEL,
                         messages=[{"role": "user", "content": "word " * 6000}]))
    f = tb.upload_ok(gw.d, tb.jsonl(lines))
    b = tb.wait_batch(gw.d, tb.create_ok(gw.d, f["id"])["id"], timeout=120)
    tb.check_batch(b, status="completed")
    assert b["request_counts"] == {"total": 7, "completed": 6, "failed": 1}, b
    out, err = tb.results(gw.d, b)
    assert sorted(x["custom_id"] for x in out) == [f"r{i}" for i in range(6)]
    assert [x["custom_id"] for x in err] == ["too-long"], err
    assert err[0]["response"]["status_code"] == 400, err
    assert err[0]["response"]["body"]["error"]["code"] == "context_length_exceeded", err
    cached = sum(cached_tokens(x["response"]["body"]) for x in out)
    assert cached > 0, "the shared system prompt was never reused"
    assert b["usage"]["input_tokens_details"]["cached_tokens"] == cached, (b["usage"], cached)


# ---------------------------------------------------------------------------- a fleet of both releases

@ONLY_2026
def test_predicted_cached_tokens_match_the_hybrid_engine(agents, gateway):
    """The review workload on b10587 with its hybrid Qwen3.5: two agents (one slot each),
    two reviews, each a long shared system prompt with a new user message per request, two
    at a time (one of each review), then the variants of the engine README: an identical
    prompt again (all but 4 tokens reused) and the next new question (only the checkpoint
    516 tokens before the first prompt's end survives the repeat). From each phone's
    eleventh request on, the gateway's predicted cached tokens (access log,
    predicted_cached_tokens) are within 10 % of the engine's cache_n.

    The gateway counts tokens as characters / 4 and the engine with its BPE, so the
    prediction is compared as the share of the prompt it says is cached: predicted ÷
    estimated_prompt_tokens × the engine's prompt tokens, against cache_n. A prediction by
    the longest run of shared blocks (no checkpoints) is off by half at the variants."""
    ags = agents(["c1", "c2"], slots=1, ctx_per_slot=4096)
    gw = start_gateway(gateway, [agent_replica(d, slots=1) for d in ags], verify={"enabled": False})
    reps = wait_until(lambda: (lambda r: r if all(x["engine_features"] for x in r.values()) else None)(gw.replicas()),
                      T(10), interval=0.2)
    assert reps and all(x["engine_features"]["cache_checkpoints"] for x in reps.values()), gw.replicas()
    systems = {k: fleet.make_prompt(1100, tag=f"review-{k}") for k in ("x", "y")}

    def body(k, i):
        return {"model": MODEL, "max_tokens": 4, "temperature": 0,
                "messages": [{"role": "system", "content": systems[k]},
                             {"role": "user", "content": f"Review change {i} of {k}: does it keep the rules? "
                                                         + fleet.make_prompt(12 + i % 5, tag=f"q{k}{i}")}]}

    plan = list(range(14)) + [13, 14, 15, 16]  # ...then the same prompt again, and new ones
    sent = []  # (wave, key, request id)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for w, i in enumerate(plan):
            futs = {k: pool.submit(gw.post, body(k, i), timeout=T(60)) for k in systems}
            for k, f in futs.items():
                r = f.result()
                check_answer(r)
                sent.append((w, k, r.headers["x-request-id"], cached_tokens(r.json())))
    by_phone = {}
    for w, k, rid, cache_n in sent:
        rec = g.access_log(gw.d, rid)
        assert rec["cached_tokens"] == cache_n, (rec, cache_n)
        by_phone.setdefault(rec["replica"], []).append((w, k, rec))
    assert sorted(by_phone) == ["c1", "c2"], {p: len(v) for p, v in by_phone.items()}
    checked, problems, variants = 0, [], 0
    for phone, recs in by_phone.items():
        assert len(recs) >= 10, {p: len(v) for p, v in by_phone.items()}
        for n, (w, k, rec) in enumerate(recs):
            p_eng, cache_n = rec["tokens_in"], rec["cached_tokens"]
            pred = rec["predicted_cached_tokens"] / rec["estimated_prompt_tokens"] * p_eng
            if 0.5 * p_eng < cache_n < 0.8 * p_eng:
                variants += 1  # the repeat erased the system prompt's checkpoint
            if n < 10:
                continue
            checked += 1
            ok = abs(pred - cache_n) <= 0.1 * cache_n if cache_n else pred <= 0.1 * p_eng
            if not ok:
                problems.append((phone, w, k, round(pred), cache_n, p_eng, rec["predicted_cached_tokens"],
                                 rec["estimated_prompt_tokens"]))
    seen = {p: [(w, k, r["cached_tokens"], r["tokens_in"], r["predicted_cached_tokens"]) for w, k, r in v]
            for p, v in by_phone.items()}
    assert checked >= 10 and variants >= 1, (checked, variants, seen)
    assert not problems, problems


@pytest.fixture
def mixed(procs, engine_of, tmp_path):
    """Factory: mixed() starts a bare 2025 engine ("old"), a bare b10587 ("new") and an
    agent supervising a b10587 ("new-agent"), all serving MODEL: the fleet an operator has
    after updating the kit on some phones. Returns (old, new, agent)."""
    def start(**kw):
        old_e, new_e = engine_of("2025"), engine_of("2026")
        old = llama.start(procs, old_e, name="old", **kw)
        old.id = "old"
        new = llama.start(procs, new_e, name="new", **kw)
        new.id = "new"
        ag = llama.start_agent(procs, new_e, tmp_path, "new-agent", **kw)
        return old, new, ag
    return start


def test_a_fleet_of_both_releases(mixed, gateway):
    """Old and new engines behind one gateway: the gateway learns what each serves (the
    bare ones by asking them, the agent's from its status, which read its engine's /props
    and asked it), shows it in the admin API, and both releases answer the same requests,
    whole and streamed, each in its own shape."""
    old, new, ag = mixed()
    st = llama.status(ag)
    assert st["engine_build"].startswith("b10587-"), st
    # the agent asked its engine whether its cache stops at checkpoints (tiny Qwen3.5: it does)
    assert st["engine_features"] == {"choices": 1, "continue_final_message": True, "responses": True,
                                     "cache_checkpoints": True}, st
    assert st["cache_isolation"] == "slots", st
    assert st["chat_template_caps"]["supports_tools"] is True, st
    # answer checks off: shadow requests still running at the end keep the agent draining
    # past the harness's 10 s stop (test_verify.py checks the real engines)
    gw = start_gateway(gateway, [bare_replica(old), bare_replica(new), agent_replica(ag)],
                       verify={"enabled": False})

    def features():
        reps = gw.replicas()
        return all(reps[i]["engine_features"] is not None for i in ("old", "new", "new-agent")) and reps
    reps = wait_until(features, T(10), interval=0.2)
    assert reps, gw.replicas()
    # a bare engine is not asked about checkpoints (the probe would take its slot 0)
    assert reps["old"]["engine_features"] == {"choices": 1, "continue_final_message": False, "responses": False,
                                              "cache_checkpoints": False}, reps
    assert reps["old"]["engine_build"] == "b0-unknown", reps["old"]
    assert reps["new"]["engine_features"] == {"choices": 2, "continue_final_message": True, "responses": True,
                                              "cache_checkpoints": False}, reps
    # the agent names slots to keep callers apart: it serves one choice per request
    assert reps["new-agent"]["engine_features"] == {"choices": 1, "continue_final_message": True, "responses": True,
                                                    "cache_checkpoints": True}, reps
    for rid in ("new", "new-agent"):
        assert reps[rid]["engine_build"].startswith("b10587-"), reps[rid]

    # six at once fill the three phones' slots: each release answers, in its own shape
    def ask(i):
        stream = i % 2 == 1
        body = dict(fleet.chat_body(f"question {i}", model=MODEL, max_tokens=200, stream=stream,
                                    include_usage=True if stream else None), ignore_eos=True)
        r = gw.post(body, stream=stream, timeout=T(60))
        if not stream:
            return r.headers.get("x-fleetgate-replica"), check_answer(r, max_tokens=200)["system_fingerprint"]
        assert r.status_code == 200, r.text
        chunks = check_stream(read_sse(r, timeout=T(60)), 200)
        first = chunks[0]["choices"][0]["delta"]
        # b10587 opens with a role chunk, the 2025 build with text
        assert (first == {"role": "assistant", "content": None}) == chunks[-1]["system_fingerprint"].startswith("b10587")
        return r.headers.get("x-fleetgate-replica"), chunks[-1]["system_fingerprint"]

    with concurrent.futures.ThreadPoolExecutor(max_workers=6) as ex:
        got = list(ex.map(ask, range(6)))
    # finish-soonest may queue all six on whichever engine it found fastest (the tiny 2025
    # model answers 200 tokens in a blink on a loaded machine): whichever release took none
    # is asked again with the other drained, whole and streamed
    releases = {"old": ("old",), "new": ("new", "new-agent")}
    for rel, ids in releases.items():
        if any(rid in ids for rid, _ in got):
            continue
        others = [rid for r, i in releases.items() if r != rel for rid in i]
        for rid in others:
            gw.drain(rid)
        got += [ask(i) for i in (6, 7)]
        for rid in others:
            gw.drain(rid, on=False)
    by_replica = {}
    for rid, fp in got:
        by_replica.setdefault(rid, set()).add(fp)
    assert "old" in by_replica and {"new", "new-agent"} & set(by_replica), got
    assert by_replica["old"] == {"b0-unknown"}, got
    assert all(fp.startswith("b10587-") for rid in ("new", "new-agent") for fp in by_replica.get(rid, ())), got


def test_several_choices_go_to_the_phone_that_writes_them(mixed, gateway):
    """"n": 2 behind a fleet of both releases: only the bare b10587 writes two choices at
    once (the 2025 build refuses them with a 500, the agent that names slots serves one per
    request), so the gateway sends them there, whole and streamed, and refuses at once what
    no phone writes ("n": 3 on phones of two slots). No phone is charged."""
    old, new, ag = mixed()
    gw = start_gateway(gateway, [bare_replica(old), bare_replica(new), agent_replica(ag)])
    assert wait_until(lambda: all(x["engine_features"] for x in gw.replicas().values()), T(10)), gw.replicas()
    for _ in range(3):
        r = gw.post(dict(fleet.chat_body("two answers", model=MODEL, max_tokens=8), n=2), timeout=T(60))
        assert r.status_code == 200, r.text
        assert r.headers["x-fleetgate-replica"] == "new", r.headers
        body = r.json()
        assert sorted(c["index"] for c in body["choices"]) == [0, 1], body
        assert all(c["finish_reason"] == "length" for c in body["choices"]), body
    r = gw.post(dict(fleet.chat_body("two streams", model=MODEL, max_tokens=8, stream=True), n=2),
                stream=True, timeout=T(60))
    assert r.status_code == 200, r.text
    assert r.headers["x-fleetgate-replica"] == "new", r.headers
    events = [line[6:] for line in sse_lines(r) if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events[-3:]
    indexes = {c["index"] for e in events[:-1] for c in json.loads(e).get("choices", [])}
    assert indexes == {0, 1}, events
    for name in ("n", "n_cmpl"):
        r = gw.post(dict(fleet.chat_body("three", model=MODEL, max_tokens=8), **{name: 3}), timeout=T(10))
        e = g.check_error(r, 400, code="unsupported_value")
        assert e["param"] == name and "more than 2 choices" in e["message"], e
    reps = gw.replicas()
    # none charged (a phone may still be busy: a check of an answer runs on after it)
    assert all(x["state"] in ("ready", "busy") and x["failures"] == 0 for x in reps.values()), \
        {k: (x["state"], x["failures"], x.get("last_error")) for k, x in reps.items()}


# ---------------------------------------------------------------------------- a thinking answer whose phone dies

def sse_lines(r):
    """A streamed response's lines, split on "\n" only (iter_lines would also split on the
    Unicode line separators a random model's text may hold)."""
    buf = b""
    for piece in r.iter_content(chunk_size=None):
        buf += piece
        *lines, buf = buf.split(b"\n")
        for line in lines:
            yield line.decode("utf-8", errors="replace")


def has_text(data):
    if data == "[DONE]":
        return False
    c = json.loads(data)
    return bool(c.get("choices") and answer_text(c["choices"][0].get("delta", {})))


def stream_until(r, n_text):
    """Read a streamed response's events until n_text chunks with text (content or
    reasoning) came; returns (their data payloads, the line iterator to go on with)."""
    lines = sse_lines(r)
    got = []
    for line in lines:
        if line.startswith("data: "):
            got.append(line[6:])
            if sum(map(has_text, got)) >= n_text:
                break
    return got, lines


def rest_of_stream(lines, got, timeout):
    """The events after those in got, until the stream ends (or timeout seconds)."""
    t0 = time.monotonic()
    for line in lines:
        if line.startswith("data: "):
            got.append(line[6:])
        if time.monotonic() - t0 > timeout:
            break
    return got


def kill_engine(d):
    d.send_signal(signal.SIGKILL)  # (marked as the test's own doing for the fixture)
    d.wait_exit(T(10))


@ONLY_2026
@pytest.mark.parametrize("thinking", [True, False], ids=["reasoning", "content"])
def test_a_stream_whose_engine_is_killed_goes_on_on_another(engines, gateway, thinking):
    """A long streamed answer of b10587 (a thinking one: all reasoning_content; or, with
    thinking turned off, content): its engine is killed mid-way, and the stream finishes
    on the other engine, which goes on inside the answer so far (continue_final_message,
    the reasoning carried in reasoning_content) and repeats none of it: one stream, one id,
    no second role chunk, every token relayed once, usage counting all of them."""
    es = engines(2, ctx_per_slot=LONG_CTX)
    gw = start_gateway(gateway, [bare_replica(d) for d in es])
    assert wait_until(lambda: all(x["engine_features"] for x in gw.replicas().values()), T(10)), gw.replicas()
    n = 3000
    # greedy: an engine that started the answer again instead of going on would repeat its start
    body = dict(fleet.chat_body("think at length", model=MODEL, max_tokens=n, stream=True, include_usage=True),
                ignore_eos=True, temperature=0)
    if not thinking:
        body["chat_template_kwargs"] = {"enable_thinking": False}
    r = gw.post(body, stream=True, timeout=T(60), headers={"x-request-id": f"killed-{thinking}"})
    assert r.status_code == 200, r.text
    first = r.headers["x-fleetgate-replica"]
    got, lines = stream_until(r, 40)
    kill_engine(next(d for d in es if d.id == first))
    got = rest_of_stream(lines, got, T(60))
    assert got and got[-1] == "[DONE]", got[-3:]
    chunks = [json.loads(d) for d in got if d != "[DONE]"]
    assert not [c for c in chunks if "error" in c], [c for c in chunks if "error" in c]
    field = "reasoning_content" if thinking else "content"
    other = "content" if thinking else "reasoning_content"
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    texts = [d.get(field) for d in deltas if d.get(field)]
    # each token once: none lost, none repeated (usage below counts them exactly). A chunk a
    # token: llama-server holds back a token that ends inside a UTF-8 character and sends it
    # with the next one, which the random tiny model's answer continued from another point
    # now and then meets (2,999 chunks for 3,000 tokens, once in a loaded suite)
    assert n - 3 <= len(texts) <= n, (len(texts), n)
    assert not [d for d in deltas if d.get(other)], "the answer changed its kind"
    # a repeated answer so far (b10587 repeats a prefilled message: prefill-echo-b10587.http)
    # would come as one chunk that starts with the answer's start
    start = "".join(texts[:3]).strip()
    echoes = [i for i, t in enumerate(texts) if i > 0 and t.lstrip().startswith(start)]
    assert not echoes, [texts[i][:200] for i in echoes]
    again = [i for i in range(1, len(texts) - 2) if texts[i:i + 3] == texts[:3]]
    assert not again, ("the answer started over", again, texts[:3])
    assert sum(1 for d in deltas if "role" in d) == 1 and "role" in deltas[0], deltas[:3]
    assert len({c["id"] for c in chunks}) == 1, {c["id"] for c in chunks}
    assert chunks[-1]["usage"]["completion_tokens"] == n, chunks[-1]
    # the other engine read the answer so far as part of its prompt (the 40 or more tokens
    # the client had before the kill), inside the assistant's turn
    alone = requests.post(next(d for d in es if d.id != first).url + CHAT,
                          json=dict(body, stream=False, max_tokens=1), timeout=T(30)).json()["usage"]["prompt_tokens"]
    assert chunks[-1]["usage"]["prompt_tokens"] >= alone + 30, (chunks[-1]["usage"], alone)
    rec = g.access_log(gw.d, f"killed-{thinking}")
    assert rec["stream_continued"] == 1 and rec["replica"] != first and rec["status"] == 200, rec
    assert rec["tokens_out"] == n, rec


def test_a_thinking_stream_ends_honestly_where_no_engine_can_go_on(mixed, gateway):
    """A thinking answer of b10587 whose engine dies, in a fleet where only a 2025 engine
    is left: that build cannot carry reasoning into an answer (it has no
    continue_final_message; its template would start a new turn), so the stream ends with
    the documented error event, without [DONE] and without asking the old engine."""
    old, new, ag = mixed(ctx_per_slot=LONG_CTX)
    ag.stop()
    # the old one planned far slower, so the new one takes the stream
    gw = start_gateway(gateway, [bare_replica(old, prefill_tps=20, decode_tps=2), bare_replica(new)])
    assert wait_until(lambda: all(x["engine_features"] for x in gw.replicas().values()), T(10)), gw.replicas()
    body = dict(fleet.chat_body("think at length", model=MODEL, max_tokens=3000, stream=True), ignore_eos=True)
    r = gw.post(dict(body, chat_template_kwargs={"enable_thinking": True}), stream=True, timeout=T(60),
                headers={"x-request-id": "no-way-on"})
    assert r.status_code == 200 and r.headers["x-fleetgate-replica"] == "new", (r.status_code, r.headers)
    old_answers = len(g.log_msgs(gw.d, "request", replica="old"))
    got, lines = stream_until(r, 20)
    kill_engine(new)
    got = rest_of_stream(lines, got, T(60))
    assert got and got[-1] != "[DONE]", got[-3:]
    err = json.loads(got[-1])["error"]
    assert err["code"] == "upstream_stream_error" and err["type"] == "server_error", err
    rec = g.access_log(gw.d, "no-way-on")
    assert rec.get("outcome") == "stream_error" and rec["attempts"] == 1, rec
    assert len(g.log_msgs(gw.d, "request", replica="old")) == old_answers


@ONLY_2026
def test_thinking_answers_through_the_gateway(engines, gateway):
    """b10587's thinking model through the gateway: its reasoning relayed whole and
    streamed (reasoning_content, content ""), counted as completion tokens in the usage
    the caller is shown and charged and in the access log; the switches that turn
    thinking off (chat_template_kwargs, reasoning_effort) reach the engine as they were
    sent."""
    d, = engines(1)
    gw = start_gateway(gateway, [bare_replica(d)])
    r = gw.post(dict(fleet.chat_body("think", model=MODEL, max_tokens=8), ignore_eos=True),
                headers={"x-request-id": "think-whole"})
    body = check_answer(r, max_tokens=8)
    msg = body["choices"][0]["message"]
    assert msg["content"] == "" and msg["reasoning_content"], msg
    assert g.access_log(gw.d, "think-whole")["tokens_out"] == 8

    r = gw.post(dict(fleet.chat_body("think", model=MODEL, max_tokens=8, stream=True, include_usage=True),
                     ignore_eos=True), stream=True, headers={"x-request-id": "think-stream"})
    chunks = check_stream(read_sse(r), 8)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert len([x for x in deltas if x.get("reasoning_content")]) == 8 and not [x for x in deltas if x.get("content")]
    assert g.access_log(gw.d, "think-stream")["tokens_out"] == 8

    for switch in ({"chat_template_kwargs": {"enable_thinking": False}}, {"reasoning_effort": "none"}):
        body = check_answer(gw.post(dict(fleet.chat_body("no thinking", model=MODEL, max_tokens=6),
                                         ignore_eos=True, **switch)), max_tokens=6)
        msg = body["choices"][0]["message"]
        assert msg["content"] and "reasoning_content" not in msg, (switch, msg)


def _streamed_case(gw, case):
    system = "You review card transactions for fraud. Answer RISK_LEVEL 1-5. " * 6
    items = " ".join(f"item{k} amount{(k * 37) % 997}" for k in range(120))
    body = {"model": MODEL, "messages": [{"role": "system", "content": system},
                                         {"role": "user", "content": f"{items} {case}"}],
            "max_tokens": 4, "stream": True, "temperature": 0.7}
    r = gw.post(body, timeout=T(60), stream=True)
    assert r.status_code == 200, r.text
    r.content  # noqa: B018  (to its end: the final chunk's timings)


def test_streams_teach_the_real_engines_prefill_pace_not_a_cached_prompts(engines, gateway, engine):
    """A phone believed slower than it is learns its pace from streams, whose first tokens
    then beat their plan: counted at the stream's end on what the engine says it read
    (the 2025 build streams no cache count, only its timings' prompt_n). A stream of a prompt
    the engine holds from before the gateway's restart, unknown to the new gateway, comes
    at once: counted on the whole prompt it taught 8-36 times the engine's pace."""
    [e] = engines(1, slots=1)
    gw = start_gateway(gateway, [bare_replica(e, prefill_tps=200)])
    _streamed_case(gw, "other")
    _streamed_case(gw, "held")
    learned = gw.replicas()[e.id]["prefill_tps"]
    assert learned > 2 * 200, learned  # learned from the streams, not left at the seed
    gw.d.stop()
    gw2 = start_gateway(gateway, [bare_replica(e, prefill_tps=learned)])
    _streamed_case(gw2, "held")
    after = gw2.replicas()[e.id]["prefill_tps"]
    assert after < 2 * learned, (learned, after)
