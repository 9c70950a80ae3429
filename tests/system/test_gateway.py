"""System tests of the gateway (`fleetgate --config FILE`) in front of simulated phones
(`fleetgate-agent --engine sim`), following issue 3's acceptance list: the fleet answers
as one dependable OpenAI server; no phone gets more requests than its slots; failures
before the first byte never reach the client while another phone could serve; the
gateway waits for a fast phone rather than start on a slow one when that finishes
sooner; the queue is bounded and has deadlines; clients that leave free their slot; bad
input gets OpenAI-shaped errors; the HTTP/1.1 front does keep-alive, pipelining,
100-continue, chunked bodies, Connection: close and header timeouts; SIGTERM drains.

Sims run SCALE (10) times faster than real time; the gateway is told their wall-clock
rates. Every wait is bounded; upper time bounds go through T()."""

import asyncio
import concurrent.futures
import hashlib
import json
import signal
import socket
import subprocess
import threading
import time

import aiohttp
import pytest

import fleet
import gwutil as g
from fleet import T, make_prompt, read_sse, wait_until
from gwutil import CHAT, COMPLETIONS, MODEL, chat, check_chat_ok, check_error, phone, replica

NODE_DIR = fleet.NODE_DIR


def post_many(d, bodies, workers, headers=None, timeout=None):
    """POST every body to d's chat endpoint from a thread pool; the responses in order."""
    def one(b):
        return d.post(CHAT, json=b, headers=headers, timeout=timeout or T(30))
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as ex:
        return list(ex.map(one, bodies))


def readyz(d):
    r = d.get("/readyz", timeout=T(3))
    return r.status_code, r.json()


# ------------------------------------------------------------------ 1. load, slots

def test_200_concurrent_requests_never_exceed_slots(sim, gateway):
    phones = [phone(sim, "p1", slots=1), phone(sim, "p2", slots=2),
              phone(sim, "p3", slots=1), phone(sim, "p4", slots=2)]
    gw = g.start_gateway(gateway, [replica(p) for p in phones])
    n = 200

    async def run():
        conn = aiohttp.TCPConnector(limit=0, force_close=True)
        tmo = aiohttp.ClientTimeout(total=T(60))
        async with aiohttp.ClientSession(connector=conn, timeout=tmo) as s:
            async def one(i):
                body = fleet.chat_body(make_prompt(24, tag=f"load{i}"), max_tokens=8)
                async with s.post(gw.url + CHAT, json=body,
                                  headers={"x-request-id": f"load-{i}"}) as r:
                    return r.status, dict(r.headers), await r.text()
            return await asyncio.gather(*(one(i) for i in range(n)))

    t0 = time.monotonic()
    with g.MetricsWatch(phones) as watch:
        results = asyncio.run(run())
    took = time.monotonic() - t0

    served = {p.id: 0 for p in phones}
    for i, (status, headers, text) in enumerate(results):
        assert status == 200, (i, status, text[:300])
        body = json.loads(text)
        assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"]
        assert body["usage"]["completion_tokens"] == 8, body["usage"]
        assert headers.get("x-request-id") == f"load-{i}", headers
        rep = headers.get("x-fleetgate-replica")
        assert rep == body["system_fingerprint"], (rep, body["system_fingerprint"])
        served[rep] += 1
    assert all(v > 0 for v in served.values()), f"a phone served nothing: {served}"
    # 200 requests of ~0.1 s over 6 slots: a few seconds when the slots are kept busy
    assert took < T(30), f"took {took:.1f} s"

    assert watch.samples >= 20, f"only {watch.samples} /metrics samples"
    assert not watch.errors, watch.errors[:5]
    for p in phones:
        assert watch.max_processing[p.id] <= p.slots, \
            f"{p.id} ran {watch.max_processing[p.id]} requests at once with {p.slots} slot(s)"
        assert watch.max_deferred[p.id] == 0, \
            f"{p.id} had {watch.max_deferred[p.id]} requests waiting inside it: " \
            "the gateway over-sent"
    # the watcher did see the phones full (the bound above was actually under test)
    assert any(watch.max_processing[p.id] == p.slots for p in phones if p.slots == 2), \
        (watch.max_processing, served)
    assert len(g.log_msgs(gw, "request", status=200)) == n


# ------------------------------------------------------------------ 2. failover

def test_killed_hung_and_503_phones_fail_no_request(sim, gateway):
    forever = {"at_s": 0, "dur_s": 1e6}
    ok_a = phone(sim, "ok-a", slots=2)
    hang_b = phone(sim, "hang-b", slots=2, fault_plan=[dict(forever, kind="hang")])
    e503_c = phone(sim, "e503-c", slots=2, fault_plan=[dict(forever, kind="error503")])
    ok_d = phone(sim, "ok-d", slots=2)
    phones = [ok_a, hang_b, e503_c, ok_d]
    gw = g.start_gateway(gateway, [replica(p) for p in phones],
                         upstream={"timeout_min_s": 1, "timeout_margin": 2},
                         # no active probes: the real requests must meet the faults
                         health={"interval_s": 0, "fall": 1, "cooldown_s": 60,
                                 "cooldown_max_s": 60})
    n = 40
    bodies = [fleet.chat_body(make_prompt(16, tag=f"f{i}"), max_tokens=20) for i in range(n)]
    results = [None] * n

    def worker(k):
        for i in range(k, n, 8):
            results[i] = gw.post(CHAT, json=bodies[i], timeout=T(30))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    try:
        # SIGKILL ok-a while it is working for the gateway
        busy = wait_until(lambda: g.sim_gauges(ok_a)[0] > 0, T(5), interval=0.01)
        assert busy, "ok-a never got work"
        ok_a.send_signal(signal.SIGKILL)
        ok_a.check_exit = False  # its -9 is the test's doing
    finally:
        for t in threads:
            t.join(timeout=T(60))
    assert not any(t.is_alive() for t in threads), "requests still running after 60 s"

    failed = [(i, r.status_code, r.text[:200]) for i, r in enumerate(results)
              if r.status_code != 200]
    assert not failed, f"{len(failed)} failed requests: {failed[:5]}"
    served = {}
    for r in results:
        body = check_chat_ok(r)
        served[body["system_fingerprint"]] = served.get(body["system_fingerprint"], 0) + 1
    assert set(served) <= {"ok-a", "ok-d"}, served
    # each bad phone really was tried and taken out of rotation
    failed_on = {r["replica"] for r in g.log_msgs(gw, "attempt failed")}
    assert {"ok-a", "hang-b", "e503-c"} <= failed_on, failed_on
    downs = {r["replica"] for r in g.log_msgs(gw, "replica state changed", to="down")}
    assert {"ok-a", "hang-b", "e503-c"} <= downs, downs
    retried = [r for r in g.log_msgs(gw, "request") if r["attempts"] > 1]
    assert retried and all(r["status"] == 200 for r in retried), retried[:3]


def test_streams_fail_over_before_the_first_byte(sim, gateway):
    forever = {"at_s": 0, "dur_s": 1e6}
    hang = phone(sim, "s-hang", slots=1, fault_plan=[dict(forever, kind="hang")])
    e503 = phone(sim, "s-503", slots=1, fault_plan=[dict(forever, kind="error503")])
    ok = phone(sim, "s-ok", slots=2)
    gw = g.start_gateway(gateway, [replica(hang), replica(e503), replica(ok)],
                         upstream={"timeout_min_s": 1, "timeout_margin": 2},
                         health={"interval_s": 0, "fall": 1, "cooldown_s": 60,
                                 "cooldown_max_s": 60})

    def stream(i):
        r = chat(gw, f"stream {i}", max_tokens=6, stream=True, timeout=(T(5), T(15)))
        return r, read_sse(r, timeout=T(15))

    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        results = list(ex.map(stream, range(4)))
    for r, res in results:
        assert r.status_code == 200, r.text[:300]
        assert r.headers.get("x-fleetgate-replica") == "s-ok", dict(r.headers)
        assert res.done and not res.timed_out, res.data[-2:]
        assert all("error" not in c for c in res.chunks()), res.data
    failed_on = {x["replica"] for x in g.log_msgs(gw, "attempt failed")}
    assert {"s-hang", "s-503"} <= failed_on, failed_on


# ------------------------------------------------------------------ 3. finish-soonest

def test_waits_for_the_fast_phone_when_it_finishes_sooner(sim, gateway):
    fast = phone(sim, "fast", slots=2, decode_tps=10)   # 20 tokens: 0.2 s
    slow = phone(sim, "slow", slots=1, decode_tps=1)    # 20 tokens: 2 s
    gw = g.start_gateway(gateway, [replica(fast), replica(slow)],
                         scheduler={"expected_output_tokens": 20})
    bodies = [fleet.chat_body(f"question {i}", max_tokens=20) for i in range(4)]
    t0 = time.monotonic()
    rs = post_many(gw, bodies, workers=4)
    took = time.monotonic() - t0
    reps = [check_chat_ok(r)["system_fingerprint"] for r in rs]
    assert reps == ["fast"] * 4, f"answered by {reps}"
    # two rounds on the fast phone (~0.4 s) rather than 2 s on the slow one
    assert took < T(1.6), f"took {took:.2f} s"
    waits = g.log_msgs(gw, "routing", decision="wait")
    assert waits, "no routing decision 'wait' in the log"
    for w in waits:
        assert w["replica"] == "fast" and w["free_replica"] == "slow", w
        assert w["predicted_finish_s"] < w["free_replica_finish_s"], w
    assert len(g.log_msgs(gw, "request", replica="slow")) == 0

    # with a long enough line the slow phone's 2 s wins for some: it is a choice, not a ban
    bodies = [fleet.chat_body(f"more {i}", max_tokens=20) for i in range(24)]
    rs = post_many(gw, bodies, workers=24)
    reps = [check_chat_ok(r)["system_fingerprint"] for r in rs]
    assert 1 <= reps.count("slow") <= 3, f"slow phone served {reps.count('slow')} of 24"


# ------------------------------------------------------------------ 4. the openai npm client

def test_openai_npm_client(sim, gateway):
    fleet.need_node_openai()
    p = phone(sim, "node-phone", slots=2, decode_tps=2)  # 20 real tokens/s: 24 tokens in 1.2 s
    gw = g.start_gateway(gateway, [replica(p)])
    proc = subprocess.run(["node", "client.mjs", gw.url + "/v1", MODEL, "24"], cwd=NODE_DIR,
                          capture_output=True, text=True, timeout=T(60))
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ok"], out

    w = out["whole"]
    assert w["object"] == "chat.completion" and w["model"] == MODEL, w
    assert w["content"] and w["finish_reason"] == "length", w
    assert w["usage"]["completion_tokens"] == 24, w
    assert w["request_id"] and w["replica"] == "node-phone" == w["system_fingerprint"], w

    s = out["stream"]
    assert s["content_type"].startswith("text/event-stream"), s["content_type"]
    assert s["request_id"] and s["replica"] == "node-phone", s
    chunks = s["chunks"]
    content = [c for c in chunks if c["content"]]
    assert len(content) >= 20, f"{len(content)} content chunks: {chunks}"
    assert s["text"] == "".join(c["content"] for c in content)
    assert any(c["finish_reason"] == "length" for c in chunks), chunks[-3:]
    assert chunks[-1]["usage"] and chunks[-1]["usage"]["completion_tokens"] == 24, chunks[-1]
    # spread over the ~1.2 s of generation, not delivered in one piece at the end
    first, last = content[0]["t_ms"], content[-1]["t_ms"]
    assert last - first >= 700, f"content chunks arrived within {last - first:.0f} ms"
    early = [c for c in content if c["t_ms"] <= first + (last - first) / 2]
    assert len(early) >= len(content) // 3, \
        f"only {len(early)} of {len(content)} chunks in the first half of the stream"
    gaps = [b["t_ms"] - a["t_ms"] for a, b in zip(content, content[1:])]
    assert max(gaps) < 600, f"a {max(gaps):.0f} ms gap between chunks: {gaps}"


# ------------------------------------------------------------------ 5. queue, deadlines, leaving

def test_queue_full_429_and_deadlines_503(sim, gateway):
    p = phone(sim, "busy", slots=1, decode_tps=2)  # 20 real tokens/s
    gw = g.start_gateway(gateway, [replica(p)], queue={"max": 2, "timeout_s": 2})
    running = g.open_chat(gw.port, "occupy the phone", max_tokens=200)  # ~10 s
    try:
        assert wait_until(lambda: g.sim_gauges(p)[0] == 1, T(3)), "the phone never got the request"
        t_q = time.monotonic()
        queued = [g.open_chat(gw.port, f"wait {i}", max_tokens=4) for i in range(2)]
        assert wait_until(lambda: readyz(gw)[1]["queued"] == 2, T(2)), readyz(gw)

        # the queue holds 2: a third waits nowhere
        t0 = time.monotonic()
        r = chat(gw, "one too many", timeout=T(5))
        assert time.monotonic() - t0 < T(1), "the 429 was not immediate"
        e = check_error(r, 429, code="queue_full", retry_after=True, what="queue full")
        assert e["type"] == "rate_limit_error", e

        # queue.timeout_s (2 s) passes with the phone still busy: 503 with Retry-After
        for c in queued:
            status, headers, body = c.read_response(timeout=T(6))
            waited = time.monotonic() - t_q
            assert status == 503, (status, body[:300])
            assert 1.8 <= waited <= T(4), f"503 after {waited:.2f} s, wanted ~2 s"
            ra = headers.get("retry-after", "")
            assert ra.isdigit() and int(ra) >= 1, headers
            assert headers.get("x-request-id"), headers
            g.check_error_body(body, 503, code="deadline_exceeded", what="queue deadline")
            c.close()

        # a shorter deadline from the client
        t0 = time.monotonic()
        r = chat(gw, "in a hurry", headers={"x-fleetgate-timeout": "0.5"}, timeout=T(5))
        took = time.monotonic() - t0
        check_error(r, 503, code="deadline_exceeded", retry_after=True, what="x-fleetgate-timeout")
        assert 0.4 <= took <= T(1.5), f"503 after {took:.2f} s, wanted ~0.5 s"
        assert g.sim_gauges(p) == (1, 0), "the phone should still be busy with the first request"
    finally:
        running.close()


def wait_slot_free(p, bound=1.0):
    """Seconds until the sim has nothing processing (fails after bound seconds)."""
    t0 = time.monotonic()
    ok = wait_until(lambda: g.sim_gauges(p, timeout=1)[0] == 0, T(bound), interval=0.02)
    took = time.monotonic() - t0
    assert ok, f"the phone's slot was still busy {took:.2f} s after the client left"
    return took


def served_at_once(gw, bound=1.0):
    t0 = time.monotonic()
    r = chat(gw, "next one", max_tokens=4, timeout=T(5))
    took = time.monotonic() - t0
    check_chat_ok(r)
    assert took < T(bound), f"the next request took {took:.2f} s"


def test_client_disconnect_frees_the_slot(sim, gateway):
    p = phone(sim, "solo", slots=1, decode_tps=2)  # 20 real tokens/s
    gw = g.start_gateway(gateway, [replica(p)])

    # running, non-streamed: the client leaves, the phone's slot frees within a second
    c = g.open_chat(gw.port, "long answer", max_tokens=200, headers={"x-request-id": "gone-1"})
    assert wait_until(lambda: g.sim_gauges(p)[0] == 1, T(3))
    time.sleep(0.3)
    c.close()
    wait_slot_free(p)
    served_at_once(gw)
    line = g.access_log(gw, "gone-1")
    assert line.get("client_gone") is True and line["status"] == 499, line

    # queued: the entry leaves the queue, and the running one is not disturbed
    run = g.open_chat(gw.port, "long again", max_tokens=200)
    assert wait_until(lambda: g.sim_gauges(p)[0] == 1, T(3))
    q = g.open_chat(gw.port, "queued and leaving", max_tokens=4, headers={"x-request-id": "gone-2"})
    assert wait_until(lambda: readyz(gw)[1]["queued"] == 1, T(2)), readyz(gw)
    q.close()
    assert wait_until(lambda: readyz(gw)[1]["queued"] == 0, T(1)), readyz(gw)
    line = g.access_log(gw, "gone-2")
    assert line["status"] == 499 and line["replica"] is None, line
    assert g.sim_gauges(p)[0] == 1
    run.close()
    wait_slot_free(p)
    served_at_once(gw)

    # a stream: the client leaves mid-answer
    body = fleet.chat_body("stream then leave", max_tokens=200, stream=True)
    c = g.RawConn(gw.port)
    c.send(g.request_bytes("POST", CHAT, gw.port, body=body))
    status, headers, _ = c.read_response(timeout=T(5), head_only=True)
    assert status == 200 and headers.get("content-type", "").startswith("text/event-stream")
    assert c.read_until(b'"delta":{"content":"', T(3)), c.buf[-300:]
    c.close()
    wait_slot_free(p)
    served_at_once(gw)


def test_interactive_before_batch_then_arrival(sim, gateway):
    p = phone(sim, "prio", slots=1, decode_tps=10)  # 100 real tokens/s
    gw = g.start_gateway(gateway, [replica(p)])
    done = {}

    def send(name, prio, max_tokens=5):
        r = chat(gw, f"prio {name}", max_tokens=max_tokens,
                 headers={"x-fleetgate-priority": prio}, timeout=T(15))
        done[name] = (time.monotonic(), r.status_code)

    occupy = threading.Thread(target=send, args=("occupy", "batch", 100))  # 1 s
    occupy.start()
    assert wait_until(lambda: g.sim_gauges(p)[0] == 1, T(3))
    threads = []
    for name, prio in (("b1", "batch"), ("b2", "batch"), ("i1", "interactive")):
        t = threading.Thread(target=send, args=(name, prio))
        t.start()
        threads.append(t)
        n = len(threads)
        assert wait_until(lambda: readyz(gw)[1]["queued"] == n, T(2)), readyz(gw)
    for t in [occupy] + threads:
        t.join(timeout=T(15))
    assert all(s == 200 for _, s in done.values()), done
    order = sorted(done, key=lambda k: done[k][0])
    assert order == ["occupy", "i1", "b1", "b2"], order


def test_token_cap_and_context_fit(sim, gateway):
    small = phone(sim, "small-ctx", slots=2, prefill_tps=2000, decode_tps=20, n_ctx=256)
    big = phone(sim, "big-ctx", slots=1, prefill_tps=200, decode_tps=5, n_ctx=4096)
    gw = g.start_gateway(gateway, [replica(small, n_ctx=256), replica(big, n_ctx=4096)],
                         scheduler={"default_max_tokens": 5})
    # no max_tokens from the client: the gateway's cap goes upstream
    body = {"model": MODEL, "messages": [{"role": "user", "content": "no cap given"}]}
    r = gw.post(CHAT, json=body)
    assert check_chat_ok(r)["usage"]["completion_tokens"] == 5
    # a prompt too long for the small (faster) phone goes to the big one, every time
    for i in range(3):
        r = chat(gw, make_prompt(400, tag=f"long{i}"), max_tokens=8, timeout=T(10))
        check_chat_ok(r, want_replica="big-ctx")
    # small prompts still use the fast phone
    check_chat_ok(chat(gw, "short"), want_replica="small-ctx")
    # too long for every phone: 400 at once, not a queue wait
    r = chat(gw, make_prompt(5000, tag="huge"), max_tokens=8, timeout=T(5))
    check_error(r, 400, code="context_length_exceeded", what="prompt over every n_ctx")


def test_upstream_timeout_follows_the_prediction(sim, gateway):
    """A request predicted to take 2 s is not cut off by a 0.5 s timeout_min_s: the
    watchdog is the prediction times the margin, plus the minimum."""
    p = phone(sim, "patient", slots=1, decode_tps=2)  # 20 real tokens/s: 40 tokens, 2 s
    gw = g.start_gateway(gateway, [replica(p)],
                         upstream={"timeout_min_s": 0.5, "timeout_margin": 1.5},
                         scheduler={"expected_output_tokens": 40})
    t0 = time.monotonic()
    r = chat(gw, "take your time", max_tokens=40, headers={"x-request-id": "long-1"},
             timeout=T(15))
    took = time.monotonic() - t0
    assert check_chat_ok(r, want_replica="patient")["usage"]["completion_tokens"] == 40
    assert took >= 1.8, took
    line = g.access_log(gw, "long-1")
    assert line["attempts"] == 1, line
    assert not g.log_msgs(gw, "attempt failed"), g.log_msgs(gw, "attempt failed")

# ------------------------------------------------------------------ 6. bad input

def bad_inputs(port):
    """(what, raw request bytes, status, code or None)."""
    def post(body, path=CHAT, headers=None):
        b = body if isinstance(body, bytes) else json.dumps(body).encode()
        return g.request_bytes("POST", path, port, body=b, headers=headers)
    msgs = [{"role": "user", "content": "hi"}]
    big = json.dumps({"model": MODEL,
                      "messages": [{"role": "user", "content": "x" * 5000}]}).encode()
    chunked_big = (f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   "Transfer-Encoding: chunked\r\n\r\n").encode()
    for i in range(0, len(big), 1000):
        part = big[i:i + 1000]
        chunked_big += f"{len(part):x}\r\n".encode() + part + b"\r\n"
    chunked_big += b"0\r\n\r\n"
    return [
        ("malformed JSON", post(b'{"model": "sim-model", "messages": ['), 400, None),
        ("body not an object", post(b'[1, 2, 3]'), 400, None),
        ("empty body", post(b""), 400, None),
        ("missing model", post({"messages": msgs}), 400, None),
        ("model not a string", post({"model": 7, "messages": msgs}), 400, None),
        ("missing messages", post({"model": MODEL}), 400, None),
        ("messages not a list", post({"model": MODEL, "messages": "hi"}), 400, None),
        ("completions without prompt", post({"model": MODEL}, path=COMPLETIONS), 400, None),
        ("unknown model", post({"model": "no-such-model", "messages": msgs}), 404,
         "model_not_found"),
        ("bad priority", post({"model": MODEL, "messages": msgs},
                              headers={"x-fleetgate-priority": "urgent"}), 400, None),
        ("bad timeout", post({"model": MODEL, "messages": msgs},
                             headers={"x-fleetgate-timeout": "soon"}), 400, None),
        ("body too large", post(big), 413, None),
        ("chunked body too large", chunked_big, 413, None),
        ("headers too large", g.request_bytes("GET", "/healthz", port,
                                              headers={"X-Big": "b" * 40000}), 431, None),
        ("too many headers", g.request_bytes("GET", "/healthz", port,
                                             headers={f"X-H{i}": "v" for i in range(300)}), 431,
         None),
        ("not HTTP", b"HELLO THERE\r\n\r\n", 400, None),
        ("GET on chat", g.request_bytes("GET", CHAT, port), 405, None),
        ("GET on completions", g.request_bytes("GET", COMPLETIONS, port), 405, None),
        ("POST on models", post(b"{}", path="/v1/models"), 405, None),
        ("unknown path", g.request_bytes("GET", "/v1/nothing-here", port), 404, None),
        ("unknown POST path", post({"model": MODEL, "messages": msgs}, path="/v2/chat"), 404, None),
    ]


def test_bad_input_gets_status_and_openai_error(sim, gateway):
    p = phone(sim, "bad-in", slots=1)
    gw = g.start_gateway(gateway, [replica(p), replica(p, id="alias", models=["other-model"])],
                         limits={"max_body_bytes": 4096})
    problems = []
    for what, raw, status, code in bad_inputs(gw.port):
        c = g.RawConn(gw.port)
        try:
            c.send(raw)
            got, headers, body = c.read_response(timeout=T(5))
        except (OSError, EOFError, TimeoutError) as e:
            problems.append(f"{what}: no response ({e!r})")
            continue
        finally:
            c.close()
        try:
            assert got == status, f"status {got}, wanted {status}: {body[:200]!r}"
            assert headers.get("content-type", "").startswith("application/json"), headers
            e = g.check_error_body(body, status, code, what)
            if what == "unknown model":
                assert "sim-model" in e["message"] and "other-model" in e["message"], e
        except AssertionError as e:
            problems.append(f"{what}: {e}")
    assert not problems, "\n".join(problems)
    # none of it reached the phone
    assert fleet.parse_prometheus(p.get("/metrics").text)["llamacpp:tokens_predicted_total"] == 0


# ------------------------------------------------------------------ 7. the HTTP/1.1 front

@pytest.fixture
def front(sim, gateway):
    p = phone(sim, "front", slots=2)
    gw = g.start_gateway(gateway, [replica(p)],
                         limits={"header_timeout_s": 1, "idle_timeout_s": 2,
                                 "max_body_bytes": 65536})
    return p, gw


def test_keep_alive_and_connection_close(front):
    p, gw = front
    c = g.RawConn(gw.port)
    try:
        for i in range(3):
            c.send(g.chat_bytes(gw.port, f"keep {i}", headers={"x-request-id": f"ka-{i}"}))
            status, headers, body = c.read_response(timeout=T(5))
            assert status == 200, body[:300]
            assert headers["x-request-id"] == f"ka-{i}"
            assert headers.get("connection", "").lower() != "close", headers
            c.send(g.request_bytes("GET", "/healthz", gw.port))
            assert c.read_response(timeout=T(5))[0] == 200
        assert not c.closed
        # Connection: close is honoured: said in the answer, then the socket closes
        c.send(g.request_bytes("GET", "/v1/models", gw.port, headers={"Connection": "close"}))
        status, headers, body = c.read_response(timeout=T(5))
        assert status == 200 and json.loads(body)["object"] == "list"
        assert headers.get("connection", "").lower() == "close", headers
        assert c.wait_closed(T(2)), "the gateway kept the connection after Connection: close"
        assert c.buf == b"", c.buf
    finally:
        c.close()
    # HTTP/1.0 without keep-alive closes too
    raw, closed = fleet.raw_exchange(gw.port, b"GET /healthz HTTP/1.0\r\n\r\n", timeout=T(3))
    assert fleet.http_status(raw) == 200 and closed, raw[:200]


def test_pipelined_requests_answered_in_order(front):
    p, gw = front
    reqs = [g.chat_bytes(gw.port, "slow first", max_tokens=30, headers={"x-request-id": "pipe-1"}),
            g.request_bytes("GET", "/healthz", gw.port),
            g.chat_bytes(gw.port, "quick third", max_tokens=1, headers={"x-request-id": "pipe-3"}),
            g.request_bytes("GET", "/nope", gw.port),
            g.chat_bytes(gw.port, "quick fifth", max_tokens=2, headers={"x-request-id": "pipe-5"})]
    c = g.RawConn(gw.port)
    try:
        c.send(b"".join(reqs))
        got = []
        for _ in reqs:
            status, headers, body = c.read_response(timeout=T(10))
            b = json.loads(body)
            if "usage" in b:  # a chat answer: its id and its length say which
                got.append((headers.get("x-request-id"), b["usage"]["completion_tokens"]))
            else:
                got.append((status, b.get("status") or b.get("error", {}).get("code")))
        assert got == [("pipe-1", 30), (200, "ok"), ("pipe-3", 1), (404, "unknown_url"),
                       ("pipe-5", 2)], got
        assert not c.closed
    finally:
        c.close()


def test_expect_100_continue_and_chunked_body(front):
    p, gw = front
    body = json.dumps(fleet.chat_body("expect me", max_tokens=3)).encode()
    c = g.RawConn(gw.port)
    try:
        c.send(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n")
        status, _, _ = c.read_response(timeout=T(3))
        assert status == 100, f"wanted 100 Continue before the body, got {status}"
        c.send(body)
        status, headers, resp = c.read_response(timeout=T(5))
        assert status == 200, resp[:300]
        assert json.loads(resp)["usage"]["completion_tokens"] == 3

        # a body over the limit is refused before the client sends it
        c2 = g.RawConn(gw.port)
        try:
            c2.send(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    f"Content-Length: 100000\r\nExpect: 100-continue\r\n\r\n")
            status, headers, resp = c2.read_response(timeout=T(3))
            assert status == 413, (status, resp[:200])
            g.check_error_body(resp, 413, what="413 on Expect")
        finally:
            c2.close()

        # chunked request body, sent in pieces, on the same connection
        c.send(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               "Transfer-Encoding: chunked\r\nx-request-id: chunky\r\n\r\n")
        for i in range(0, len(body), 7):
            part = body[i:i + 7]
            c.send(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            time.sleep(0.005)
        c.send(b"0\r\n\r\n")
        status, headers, resp = c.read_response(timeout=T(5))
        assert status == 200, resp[:300]
        assert headers["x-request-id"] == "chunky"
        assert json.loads(resp)["usage"]["completion_tokens"] == 3
    finally:
        c.close()


def test_slow_headers_time_out_while_others_are_served(front):
    p, gw = front
    s = g.RawConn(gw.port)
    t0 = time.monotonic()
    stop = threading.Event()

    def dribble():
        s.send(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\n")
        for i in range(40):
            if stop.wait(0.1):
                return
            try:
                s.send(f"X-Drip-{i}: {i}\r\n")
            except OSError:
                return

    t = threading.Thread(target=dribble)
    t.start()
    try:
        # another client is served normally meanwhile
        time.sleep(0.3)
        t1 = time.monotonic()
        check_chat_ok(chat(gw, "not slow", max_tokens=4, timeout=T(5)))
        assert time.monotonic() - t1 < T(1)
        closed = s.wait_closed(T(3.5))
        took = time.monotonic() - t0
    finally:
        stop.set()
        t.join(timeout=5)
        s.close()
    assert closed, "the slow client was still connected 3.5 s after it started (header_timeout_s 1)"
    assert 0.8 <= took <= T(2.5), f"closed after {took:.2f} s with header_timeout_s 1"
    if s.buf:  # a 408 is optional; if one came it is well formed
        assert fleet.http_status(s.buf) == 408, s.buf[:200]

    # an idle keep-alive connection is closed after idle_timeout_s (2 s)
    c = g.RawConn(gw.port)
    try:
        c.send(g.request_bytes("GET", "/healthz", gw.port))
        assert c.read_response(timeout=T(3))[0] == 200
        t0 = time.monotonic()
        assert c.wait_closed(T(4)), "an idle connection outlived idle_timeout_s"
        assert 1.5 <= time.monotonic() - t0, "closed before idle_timeout_s"
    finally:
        c.close()


# ------------------------------------------------------------------ 8. retries, models, health

def test_retries_exhausted_is_502(sim, gateway):
    plan = [{"at_s": 0, "kind": "error503", "dur_s": 1e6}]
    a = phone(sim, "sick-a", fault_plan=plan)
    b = phone(sim, "sick-b", fault_plan=plan)
    gw = g.start_gateway(gateway, [replica(a), replica(b)],
                         # no active probes (they would keep both out of rotation)
                         scheduler={"retries": 1}, health={"interval_s": 0, "fall": 100})
    r = chat(gw, "nobody can", headers={"x-request-id": "r502"}, timeout=T(10))
    e = check_error(r, 502, what="retries exhausted")
    assert e["type"] == "server_error", e
    line = g.access_log(gw, "r502")
    assert line["attempts"] == 2 and line["status"] == 502, line
    tried = [x["replica"] for x in g.log_msgs(gw, "attempt failed", request_id="r502")]
    assert sorted(tried) == ["sick-a", "sick-b"], tried  # the retry went to the other phone


def test_models_and_health_endpoints(sim, gateway):
    a = phone(sim, "ma", model=MODEL)
    b = phone(sim, "mb", model="b-model")
    gw = g.start_gateway(gateway, [replica(a, models=[MODEL, "extra-model"]), replica(b),
                                   replica(b, id="drained", models=["drained-model"],
                                           drain=True)])
    r = gw.get("/v1/models")
    assert r.status_code == 200 and r.headers.get("x-request-id")
    body = r.json()
    assert body["object"] == "list", body
    ids = [m["id"] for m in body["data"]]
    assert sorted(ids) == sorted([MODEL, "extra-model", "b-model"]), ids
    assert all(m["object"] == "model" for m in body["data"]), body
    r = gw.get("/healthz")
    assert r.status_code == 200, r.text
    status, body = readyz(gw)
    assert status == 200, body
    check_chat_ok(chat(gw, model="b-model"), want_replica="mb")


def test_readyz_503_when_every_replica_is_down(sim, gateway):
    a = phone(sim, "lone")
    gw = g.start_gateway(gateway, [replica(a)], scheduler={"retries": 0},
                         health={"interval_s": 0.2, "fall": 1, "cooldown_s": 60,
                                 "cooldown_max_s": 60})
    assert readyz(gw)[0] == 200
    a.send_signal(signal.SIGKILL)
    a.check_exit = False  # its -9 is the test's doing
    assert a.wait_exit(5) is not None
    # the health checks (every 0.2 s) notice
    assert wait_until(lambda: readyz(gw)[0] == 503, T(2)), readyz(gw)
    status, body = readyz(gw)
    assert body["replicas_ready"] == 0, body
    assert gw.get("/healthz").status_code == 200
    assert gw.get("/v1/models").json()["data"] == []
    # nothing can serve it now: the deadline answers
    r = chat(gw, "still nobody", headers={"x-fleetgate-timeout": "0.5"}, timeout=T(5))
    check_error(r, 503, code="deadline_exceeded", retry_after=True, what="no ready replica")


def test_readyz_shows_fleet_counts_only_with_the_admin_token(sim, gateway):
    """/readyz is for load balancers: the status alone (200/503). How many phones and
    how long the queue are are shown to the admin token only (or with
    health.readyz_counts, which these tests' defaults turn on)."""
    a = phone(sim, "lone")
    token = "admin-token-for-readyz-0123"

    def config(ports):
        cfg = g.gw_config(ports[0], [replica(a)], health={"readyz_counts": False})
        cfg["admin"] = {"listen": f"{fleet.HOST}:{ports[1]}", "token": token}
        return cfg

    gw = gateway(config, n_ports=2, ready=lambda d: chat(d).status_code == 200)
    status, body = readyz(gw)
    assert (status, body) == (200, {"status": "ready"}), body
    r = gw.get("/readyz", headers={"Authorization": "Bearer not-the-token"})
    assert r.json() == {"status": "ready"}, r.text
    r = gw.get("/readyz", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200
    assert r.json() == {"status": "ready", "replicas_ready": 1, "replicas": 1, "queued": 0}, r.text
    a.send_signal(signal.SIGKILL)
    a.check_exit = False
    assert wait_until(lambda: readyz(gw)[0] == 503, T(5)), readyz(gw)
    assert readyz(gw)[1] == {"status": "not_ready"}


def test_a_key_limited_to_some_models_learns_nothing_of_the_others(sim, gateway):
    limited, full = "sk-limited-models-0123", "sk-all-models-0123"
    keys = [{"name": "limited", "key_sha256": hashlib.sha256(limited.encode()).hexdigest(),
             "models": [MODEL, "retired-model"]},
            {"name": "full", "key_sha256": hashlib.sha256(full.encode()).hexdigest()}]
    a = phone(sim, "pa")
    b = phone(sim, "pb", model="secret-model")
    gw = g.start_gateway(gateway, [replica(a), replica(b)], api_keys=keys)
    lim = {"Authorization": f"Bearer {limited}"}
    # a model outside its list, served or not: the same 403, naming no other model
    for m in ("secret-model", "no-such-model"):
        r = chat(gw, model=m, headers=lim)
        e = check_error(r, 403, code="model_not_allowed", what=m)
        assert "secret-model" not in e["message"] or m == "secret-model", e
        assert MODEL not in e["message"], e
    # in its list but served by no phone: 404, listing only what it may use
    e = check_error(chat(gw, model="retired-model", headers=lim), 404, code="model_not_found")
    assert "secret-model" not in e["message"] and MODEL in e["message"], e
    # the model list and lookups show only its models
    r = gw.get("/v1/models", headers=lim)
    assert [m["id"] for m in r.json()["data"]] == [MODEL], r.text
    check_error(gw.get("/v1/models/secret-model", headers=lim), 404, code="model_not_found")
    assert gw.get(f"/v1/models/{MODEL}", headers=lim).status_code == 200
    check_chat_ok(chat(gw, headers=lim))
    # a key without a list still sees the whole fleet
    f = {"Authorization": f"Bearer {full}"}
    e = check_error(chat(gw, model="no-such-model", headers=f), 404, code="model_not_found")
    assert "secret-model" in e["message"] and MODEL in e["message"], e
    r = gw.get("/v1/models", headers=f)
    assert sorted(m["id"] for m in r.json()["data"]) == sorted([MODEL, "secret-model"]), r.text


# ------------------------------------------------------------------ 9. SIGTERM

def test_sigterm_finishes_in_flight_then_exits_zero(sim, gateway):
    p = phone(sim, "term", slots=2, decode_tps=10)  # 100 real tokens/s
    gw = g.start_gateway(gateway, [replica(p)])
    bodies = [fleet.chat_body(f"drain {i}", max_tokens=80) for i in range(4)]  # 0.8 s each
    idle = g.RawConn(gw.port)  # a keep-alive connection with nothing in flight
    idle.send(g.request_bytes("GET", "/healthz", gw.port))
    assert idle.read_response(timeout=T(3))[0] == 200

    def stream():
        r = chat(gw, "drain stream", max_tokens=80, stream=True, timeout=(T(5), T(15)))
        return r, read_sse(r, timeout=T(15))

    with concurrent.futures.ThreadPoolExecutor(5) as ex:
        sfut = ex.submit(stream)
        assert wait_until(lambda: g.sim_gauges(p)[0] == 1, T(3)), "the stream never started"
        futs = [ex.submit(gw.post, CHAT, json=b, timeout=T(15)) for b in bodies]
        assert wait_until(lambda: readyz(gw)[1]["queued"] >= 3, T(3)), readyz(gw)
        t0 = time.monotonic()
        gw.send_signal(signal.SIGTERM)

        def refused():
            try:
                socket.create_connection((fleet.HOST, gw.port), timeout=0.5).close()
                return False
            except ConnectionRefusedError:
                return True
            except OSError:  # a connect timing out on a loaded machine: look again
                return False
        assert wait_until(refused, T(1), interval=0.02), "still accepting after SIGTERM"
        assert time.monotonic() - t0 < T(0.5)
        assert idle.wait_closed(T(1)), "an idle keep-alive connection kept open during shutdown"
        idle.close()
        rs = [f.result(timeout=T(15)) for f in futs]
        sresp, sres = sfut.result(timeout=T(15))
    for r in rs:
        check_chat_ok(r)
        assert r.json()["usage"]["completion_tokens"] == 80
    assert sresp.status_code == 200 and sres.done and not sres.timed_out, sres.data[-2:]
    assert sum(1 for c in sres.chunks()
               if c["choices"] and c["choices"][0]["delta"].get("content")) == 80
    rc = gw.wait_exit(T(5))
    assert rc == 0, f"exit code {rc}\n{gw.logs()}"


def test_sigint_idle_exits_zero(sim, gateway):
    p = phone(sim, "int", slots=1)
    gw = g.start_gateway(gateway, [replica(p)])
    check_chat_ok(chat(gw))
    gw.send_signal(signal.SIGINT)
    rc = gw.wait_exit(T(5))
    assert rc == 0, f"exit code {rc}\n{gw.logs()}"

# ------------------------------------------------------------------ 10. a stream that dies

def test_stream_dropped_mid_answer_ends_with_error_event(sim, gateway):
    p = phone(sim, "dropper", slots=1, decode_tps=5,
              fault_plan=[{"at_s": 0, "kind": "drop", "dur_s": 1e6}])
    gw = g.start_gateway(gateway, [replica(p)])
    t0 = time.monotonic()
    r = chat(gw, "talk to me", max_tokens=60, stream=True, headers={"x-request-id": "drop-1"},
             timeout=(T(5), T(15)))
    assert r.status_code == 200, r.text
    assert r.headers.get("x-fleetgate-replica") == "dropper"
    res = read_sse(r, timeout=T(15))
    took = time.monotonic() - t0
    assert not res.timed_out, f"the stream hung: {res.data[-3:]}"
    assert res.data, "no events at all"
    assert not res.done and "[DONE]" not in res.data, \
        f"a dropped stream ended with [DONE]: {res.data[-3:]}"
    last = json.loads(res.data[-1])
    assert "error" in last, \
        f"the stream ended without an error event (silent truncation): {res.data[-3:]}"
    g.check_error_body(json.dumps(last), 200, what="stream error event")
    got = [c for c in res.chunks()[:-1]
           if c.get("choices") and c["choices"][0]["delta"].get("content")]
    assert got, "no content before the drop"
    assert len(got) < 60
    assert took < T(5), f"the broken stream took {took:.1f} s to end"
    line = g.access_log(gw, "drop-1")
    assert line["replica"] == "dropper", line


def test_stream_backpressure_a_stalled_client_gets_everything(sim, gateway):
    """A client that stops reading: the gateway holds the upstream (its job lasts until
    the client reads) rather than dropping or truncating, and every token arrives."""
    n = 40000  # ~9.5 MB of SSE, far more than the socket buffers and the high-water mark
    p = phone(sim, "firehose", slots=1, decode_tps=2000, n_ctx=100000)  # 20k real tokens/s
    gw = g.start_gateway(gateway, [replica(p)], upstream={"stream_idle_timeout_s": 2})
    c = g.RawConn(gw.port, rcvbuf=64 * 1024)
    try:
        c.send(g.request_bytes("POST", CHAT, gw.port, headers={"x-request-id": "bp-1"},
                               body=fleet.chat_body("flood", max_tokens=n, stream=True)))
        stall = 3.5  # longer than the generation (2 s) and than stream_idle_timeout_s
        time.sleep(stall)
        assert c.read_until(b"data: [DONE]", T(20)), f"no [DONE]; got {len(c.buf)} bytes"
        assert c.read_until(b"\r\n0\r\n\r\n", T(2)), c.buf[-100:]
    finally:
        c.close()
    head, _, raw = c.buf.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    parts, i = [], 0
    for _ in range(1000000):
        j = raw.index(b"\r\n", i)
        size = int(raw[i:j], 16)
        if size == 0:
            break
        parts.append(raw[j + 2:j + 2 + size])
        i = j + 2 + size + 2
    events = fleet.parse_sse_text(b"".join(parts).decode())
    assert events[-1] == "[DONE]"
    chunks = [json.loads(d) for d in events[:-1]]
    assert not [x for x in chunks if "error" in x], [x for x in chunks if "error" in x][:1]
    deltas = [x["choices"][0]["delta"].get("content") for x in chunks if x.get("choices")]
    assert sum(1 for d in deltas if d) == n
    line = g.access_log(gw, "bp-1")
    assert line["status"] == 200 and line["tokens_out"] == n, line
    # the upstream was held while the client stalled (not read to the end into memory)
    assert line["duration_ms"] >= (stall - 1.0) * 1000, line

# ------------------------------------------------------------------ 11. ids, replica, access log

def test_request_ids_replica_header_and_access_log(sim, gateway):
    p = phone(sim, "idp", slots=2)
    gw = g.start_gateway(gateway, [replica(p)], limits={"max_body_bytes": 4096})

    r1, r2 = chat(gw), chat(gw)
    b1 = check_chat_ok(r1, want_replica="idp")
    check_chat_ok(r2, want_replica="idp")
    assert r1.headers["x-request-id"] != r2.headers["x-request-id"]

    rid = {"x-request-id": "client-id-42"}
    r = chat(gw, "with my id", headers=rid, max_tokens=5)
    body = check_chat_ok(r, want_replica="idp")
    assert r.headers["x-request-id"] == "client-id-42"

    r = gw.post(COMPLETIONS, json={"model": MODEL, "prompt": "Once upon", "max_tokens": 4},
                headers={"x-request-id": "cmpl-1"})
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "text_completion", r.text
    assert r.headers["x-request-id"] == "cmpl-1"
    assert r.headers["x-fleetgate-replica"] == r.json()["system_fingerprint"] == "idp"

    r = gw.post(COMPLETIONS, json={"model": MODEL, "prompt": "Once", "max_tokens": 3,
                                   "stream": True}, stream=True, timeout=(T(5), T(10)))
    assert r.status_code == 200 and r.headers["x-fleetgate-replica"] == "idp"
    res = read_sse(r, timeout=T(10))
    assert res.done and res.chunks()[0]["object"] == "text_completion", res.data[:2]

    r = chat(gw, "streamed", stream=True, max_tokens=4, headers={"x-request-id": "strm-1"},
             timeout=(T(5), T(10)))
    assert r.headers["x-request-id"] == "strm-1" and r.headers["x-fleetgate-replica"] == "idp"
    res = read_sse(r, timeout=T(10))
    assert res.done and res.chunks()[0]["system_fingerprint"] == "idp"

    line = g.access_log(gw, "client-id-42")
    for k in ("request_id", "model", "replica", "attempts", "queue_wait_ms", "ttfb_ms",
              "duration_ms", "tokens_in", "tokens_out", "status"):
        assert k in line, f"access log lacks {k}: {line}"
    assert line["model"] == MODEL and line["replica"] == "idp" and line["status"] == 200, line
    assert line["attempts"] == 1 and line["queue_wait_ms"] >= 0, line
    assert 0 <= line["ttfb_ms"] <= line["duration_ms"], line
    assert line["tokens_in"] == body["usage"]["prompt_tokens"], (line, body["usage"])
    assert line["tokens_out"] == body["usage"]["completion_tokens"] == 5, line
    assert b1["usage"]["completion_tokens"] == 8


def test_every_response_carries_the_clients_request_id(sim, gateway):
    """Errors from every layer (admission, routing, the HTTP parser's limits) and the
    other endpoints echo the client's x-request-id, as successful answers do."""
    p = phone(sim, "echo", slots=1)
    gw = g.start_gateway(gateway, [replica(p)], limits={"max_body_bytes": 4096})
    problems = []
    for what, method, path, kw in [
            ("unknown model", "POST", CHAT, {"json": fleet.chat_body("x", model="nope")}),
            ("malformed", "POST", CHAT, {"data": b"{nope"}),
            ("too large", "POST", CHAT, {"data": b"{" + b" " * 5000 + b"}"}),
            ("wrong method", "GET", CHAT, {}),
            ("unknown path", "GET", "/nowhere", {}),
            ("models", "GET", "/v1/models", {}),
            ("healthz", "GET", "/healthz", {}),
            ("readyz", "GET", "/readyz", {})]:
        want = f"echo-{what.replace(' ', '-')}"
        r = gw.request(method, path, headers={"x-request-id": want}, **kw)
        if r.headers.get("x-request-id") != want:
            problems.append(f"{what}: {method} {path} -> {r.status_code}, x-request-id "
                            f"{r.headers.get('x-request-id')!r}, wanted {want!r}")
    assert g.access_log(gw, "echo-unknown-model")["status"] == 404
    # without one, each response gets its own
    ids = [gw.request(m, path).headers.get("x-request-id")
           for m, path in [("GET", "/healthz"), ("GET", "/healthz"), ("GET", CHAT),
                           ("GET", "/nowhere")]]
    if not (all(ids) and len(set(ids)) == len(ids)):
        problems.append(f"responses without a client id got ids {ids}")
    assert not problems, "x-request-id problems:\n" + "\n".join(problems)


def test_access_log_counts_streamed_tokens(sim, gateway):
    """A stream without stream_options.include_usage still has llama-server's timings in
    its last chunk: the access log's tokens_out must not read 0."""
    p = phone(sim, "tok", slots=1)
    gw = g.start_gateway(gateway, [replica(p)])
    r = chat(gw, "count me", stream=True, max_tokens=6, headers={"x-request-id": "tok-1"},
             timeout=(T(5), T(10)))
    res = read_sse(r, timeout=T(10))
    assert res.done
    assert res.chunks()[-1]["timings"]["predicted_n"] == 6
    line = g.access_log(gw, "tok-1")
    assert line["tokens_out"] == 6, \
        f"streamed 6 tokens, access log says {line['tokens_out']}: {line}"


def test_request_moves_off_a_phone_that_goes_down(sim, gateway):
    """The phone working on a request hangs (its health checks time out): once the
    gateway marks it down, the request, which can get no answer there, moves to the other
    phone at once instead of waiting out its timeout."""
    hanger = g.phone(sim, "hanger", slots=1, prefill_tps=20, decode_tps=50,      # 200 tok/s wall
                     fault_plan=[{"at_s": 40, "kind": "hang", "dur_s": 100000}])  # from 4 s wall
    steady = g.phone(sim, "steady", slots=1, prefill_tps=30, decode_tps=50)       # 300 tok/s wall
    gw = g.start_gateway(gateway, [g.replica(hanger, prefill_tps=2000), g.replica(steady)],
                         health={"interval_s": 0.3, "timeout_s": 0.5, "fall": 2, "rise": 1})
    prompt = " ".join(f"word{i}" for i in range(800))  # ~1,500 tokens: 7.5 s on hanger
    t0 = time.monotonic()
    r = g.chat(gw, prompt, max_tokens=4, timeout=T(60))
    took = time.monotonic() - t0
    assert r.status_code == 200, r.text
    assert r.headers["x-fleetgate-replica"] == "steady", r.headers
    fails = g.log_msgs(gw, "attempt failed", replica="hanger")
    assert [f["reason"] for f in fails] == ["down"], fails
    assert took < 20, took


def two_agent_phones(sim, gateway, names=("slowpoke", "steady"), slots=1, first_slow=True, **gw):
    """Two agent phones for the progress-report tests: the first planned at 400 prompt
    tokens/s (wall) and, when first_slow, reading 5x slower from the start (80); the second
    at 300. The gateway probes both every 0.3 s, so reports arrive quickly."""
    plan = [{"at_s": 0, "kind": "slow", "dur_s": 100000}] if first_slow else None
    first = g.phone(sim, names[0], slots=slots, prefill_tps=40, decode_tps=50, fault_plan=plan)
    second = g.phone(sim, names[1], slots=slots, prefill_tps=30, decode_tps=50)
    return g.start_gateway(gateway, [g.replica(first, agent=True), g.replica(second, agent=True)],
                           health={"interval_s": 0.3, "timeout_s": 0.5, "fall": 2, "rise": 1}, **gw)


def test_request_moves_off_a_phone_that_turned_slow(sim, gateway):
    """The phone chosen for a long prompt reads it 5x slower than the gateway planned (it
    turned hot): the agent's progress report, read by the next health check, shows it,
    and the request moves once to the other phone, which finishes it far sooner than the
    slow one would have. No retry is spent, and the slow phone's pace is learnt."""
    gw = two_agent_phones(sim, gateway, scheduler={"retries": 0, "default_max_tokens": 64,
                                                   "expected_output_tokens": 8})
    prompt = " ".join(f"word{i}" for i in range(1000))  # ~2,000 tokens: 25 s on slowpoke, 7 s on steady
    t0 = time.monotonic()
    r = g.chat(gw, prompt, max_tokens=4, timeout=T(60))
    took = time.monotonic() - t0
    assert r.status_code == 200, r.text
    assert r.headers["x-fleetgate-replica"] == "steady", r.headers
    moves = g.log_msgs(gw, "routing", decision="move")
    assert len(moves) == 1 and moves[0]["replica"] == "slowpoke", moves
    assert moves[0]["to_replica"] == "steady" and moves[0]["prefill_tps"] < 200, moves[0]
    fails = g.log_msgs(gw, "attempt failed", replica="slowpoke")
    assert [f["reason"] for f in fails] == ["slow"], fails
    assert took < 18, took
    # the report taught the gateway the slow phone's pace: the next long prompt goes
    # straight to the other phone (planned at 400 tokens/s, slowpoke would win again)
    r = g.chat(gw, "again " + prompt, max_tokens=4, timeout=T(60))
    assert r.status_code == 200, r.text
    assert r.headers["x-fleetgate-replica"] == "steady", r.headers
    assert len(g.log_msgs(gw, "routing", decision="move")) == 1


def test_progress_with_a_request_id_used_twice_is_ignored(sim, gateway):
    """Two concurrent requests from a client that sends the same x-request-id both run on
    a phone that turned slow: its report cannot say which entry is which, so neither is
    moved on its word, and both are answered (a move of one id twice once corrupted the
    queue)."""
    gw = two_agent_phones(sim, gateway, slots=2)
    prompt = " ".join(f"word{i}" for i in range(400))  # ~800 tokens: 10 s on slowpoke
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        futs = [ex.submit(g.chat, gw, f"{k} {prompt}", max_tokens=4, timeout=T(60),
                          headers={"x-request-id": "dup-id"}) for k in range(2)]
        got = [f.result() for f in futs]
    assert [r.status_code for r in got] == [200, 200], [r.text for r in got]
    assert [r.headers["x-fleetgate-replica"] for r in got] == ["slowpoke", "slowpoke"]
    assert g.log_msgs(gw, "routing", decision="move") == []
    assert g.chat(gw, "still serving", max_tokens=2, timeout=T(30)).status_code == 200


def test_a_phone_at_its_planned_pace_keeps_its_request(sim, gateway):
    """Progress reports move nothing off a phone that works as planned, even when another
    phone is free: a request leaves only a phone that is far slower than the plan."""
    gw = two_agent_phones(sim, gateway, names=("a", "b"), first_slow=False)
    prompt = " ".join(f"word{i}" for i in range(1000))
    r = g.chat(gw, prompt, max_tokens=4, timeout=T(60))
    assert r.status_code == 200, r.text
    assert r.headers["x-fleetgate-replica"] == "a", r.headers
    assert g.log_msgs(gw, "routing", decision="move") == []
    assert g.log_msgs(gw, "attempt failed") == []


def test_an_expired_request_leaves_the_rest_of_the_queue_intact(sim, gateway):
    """A request whose deadline passes at the head of the queue is answered 503 and taken
    out alone: the requests behind it are still served, in order (a double removal once
    emptied the queue and left them waiting forever)."""
    p = phone(sim, "one", slots=1, decode_tps=5)  # 50 real tokens/s
    gw = g.start_gateway(gateway, [replica(p)], queue={"max": 10, "timeout_s": 30})
    running = g.open_chat(gw.port, "occupy the phone", max_tokens=60)  # ~1.2 s
    try:
        assert wait_until(lambda: g.sim_gauges(p)[0] == 1, T(3)), "the phone never got the request"
        hurry = g.open_chat(gw.port, "in a hurry", max_tokens=2, headers={"x-fleetgate-timeout": "0.3"})
        assert wait_until(lambda: readyz(gw)[1]["queued"] == 1, T(2)), readyz(gw)
        behind = [g.open_chat(gw.port, f"behind {i}", max_tokens=2) for i in range(2)]
        assert wait_until(lambda: readyz(gw)[1]["queued"] == 3, T(2)), readyz(gw)
        status, _, body = hurry.read_response(timeout=T(3))
        assert status == 503, body[:300]
        g.check_error_body(body, 503, code="deadline_exceeded")
        for c in behind:
            status, _, body = c.read_response(timeout=T(10))
            assert status == 200, (status, body[:300])
        status, _, _ = running.read_response(timeout=T(10))
        assert status == 200
        assert readyz(gw)[1]["queued"] == 0
    finally:
        running.close()
