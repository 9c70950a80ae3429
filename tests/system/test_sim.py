"""System tests of the simulated phone (`fleetgate-agent --engine sim`): a client must not
tell it from llama-server by its API (compared with the captures in fixtures/), it refuses
the requests llama-server refuses with the same status and message, it answers tool calls,
response_format and logprobs in llama-server's shapes (the official openai npm client
included), it takes time like a phone (slots, prefill and decode rates, prefix cache, time
scale), and its fault plan, loading time, token check and shutdown do what they say."""

import concurrent.futures
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests

import enginecmp
import fleet
import llama
from fleet import T, Capture, assert_shape, chat_body, make_prompt, read_sse

MODEL = "sim-model"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
NODE_DIR = Path(__file__).resolve().parent / "node"


def chatml_tokens(content):
    """The sim's prompt-token estimate for one user message: ChatML text / 4, rounded up."""
    text = f"<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"
    return math.ceil(len(text) / 4)


def post_chat(d, content, max_tokens=8, timeout=None, **kw):
    return d.post(CHAT, json=chat_body(content, model=d.model, max_tokens=max_tokens, **kw),
                  timeout=timeout)


def stream_chat(d, content, max_tokens=8, include_usage=True, timeout=None, **kw):
    body = chat_body(content, model=d.model, max_tokens=max_tokens, stream=True,
                     include_usage=include_usage, **kw)
    return d.post(CHAT, json=body, stream=True,
                  timeout=timeout if timeout is not None else (T(5), T(15)))


def check_usage_and_timings(body):
    """The numbers in usage and timings agree with each other."""
    u, t = body["usage"], body["timings"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u
    assert t["prompt_n"] + t["cache_n"] == u["prompt_tokens"], (u, t)
    assert u["prompt_tokens_details"]["cached_tokens"] == t["cache_n"], (u, t)
    assert t["predicted_n"] == u["completion_tokens"], (u, t)
    assert t["prompt_ms"] >= 0 and t["predicted_ms"] > 0, t
    assert t["predicted_per_second"] > 0, t


def error_template():
    """llama-server's error shape: {"error":{"code","message","type"}}, no param."""
    return Capture("error-404.http").json()


# ------------------------------------------------------------------ 1. conformance

def test_chat_matches_capture(sim):
    d = sim(slots=2, n_ctx=4096, id="phone-chat")
    content = "Say something about phones. " * 3
    r = post_chat(d, content, max_tokens=8)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("application/json"), r.headers
    body = r.json()
    assert_shape(body, Capture("chat.http").json(), what="chat completion")
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert body["model"] == MODEL
    assert abs(body["created"] - time.time()) < 3600
    assert len(body["choices"]) == 1
    ch = body["choices"][0]
    assert ch["index"] == 0 and ch["message"]["role"] == "assistant"
    assert isinstance(ch["message"]["content"], str) and ch["message"]["content"]
    assert ch["finish_reason"] in ("length", "stop")
    u = body["usage"]
    assert 1 <= u["completion_tokens"] <= 8, "the cap max_tokens=8 is not respected"
    if ch["finish_reason"] == "length":
        assert u["completion_tokens"] == 8
    assert len(content) // 4 <= u["prompt_tokens"] <= chatml_tokens(content) + 2, u
    check_usage_and_timings(body)
    assert body["timings"]["cache_n"] == 0, "a fresh phone has nothing cached"


def test_chat_stream_matches_capture(sim):
    d = sim(slots=2, n_ctx=4096, id="phone-stream")
    r = stream_chat(d, "Stream me a few tokens, please.", max_tokens=6, include_usage=True)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/event-stream"), r.headers
    res = read_sse(r)
    assert res.error is None, res.error
    assert res.done, f"stream did not end with [DONE]: {res.data[-3:]}"
    assert res.data.count("[DONE]") == 1
    cap = [json.loads(x) for x in Capture("chat-stream.http").sse() if x != "[DONE]"]
    cap_role, cap_content, cap_finish, cap_usage = cap[0], cap[1], cap[-2], cap[-1]
    chunks = res.chunks()
    assert len(chunks) >= 4, chunks
    role, contents, finish, usage = chunks[0], chunks[1:-2], chunks[-2], chunks[-1]

    assert_shape(role, cap_role, what="role chunk")
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert role["choices"][0]["finish_reason"] is None
    assert contents, "no content chunks"
    for c in contents:
        assert_shape(c, cap_content, what="content chunk")
        assert isinstance(c["choices"][0]["delta"]["content"], str)
        assert c["choices"][0]["finish_reason"] is None
    assert "".join(c["choices"][0]["delta"]["content"] for c in contents)
    assert_shape(finish, cap_finish, what="finish chunk")
    assert finish["choices"][0]["delta"] == {}
    assert finish["choices"][0]["finish_reason"] in ("length", "stop")
    assert_shape(usage, cap_usage, what="usage chunk")
    assert usage["choices"] == []
    check_usage_and_timings(usage)
    assert 1 <= usage["usage"]["completion_tokens"] <= 6
    assert len(contents) <= usage["usage"]["completion_tokens"]
    if finish["choices"][0]["finish_reason"] == "length":
        assert usage["usage"]["completion_tokens"] == 6
    for c in chunks:
        assert c["object"] == "chat.completion.chunk"
        assert c["id"] == role["id"] and c["id"].startswith("chatcmpl-")
        assert c["created"] == role["created"]
        assert c["model"] == MODEL


def test_completions_non_stream(sim):
    d = sim(slots=1, n_ctx=4096, id="phone-cmpl")
    prompt = make_prompt(50, "cmpl")
    r = d.post(COMPLETIONS, json={"model": MODEL, "prompt": prompt, "max_tokens": 5})
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("application/json")
    body = r.json()
    chat_cap = Capture("chat.http").json()
    template = {
        "choices": [{"text": "", "index": 0, "finish_reason": "length"}],
        "created": 0, "model": "", "system_fingerprint": "", "object": "", "id": "",
        "usage": {"completion_tokens": 0, "prompt_tokens": 0, "total_tokens": 0},
        "timings": chat_cap["timings"],
    }
    assert_shape(body, template, mode="superset", what="text completion")
    assert_shape(body["timings"], chat_cap["timings"], what="text completion timings")
    assert body["object"] == "text_completion"
    assert body["model"] == MODEL and body["system_fingerprint"] == "phone-cmpl"
    ch = body["choices"][0]
    assert ch["index"] == 0 and isinstance(ch["text"], str) and ch["text"]
    assert ch["finish_reason"] in ("length", "stop")
    u = body["usage"]
    assert 1 <= u["completion_tokens"] <= 5
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert 48 <= u["prompt_tokens"] <= 52, f"200 characters should be about 50 tokens: {u}"
    assert body["timings"]["prompt_n"] + body["timings"]["cache_n"] == u["prompt_tokens"]


def test_completions_stream(sim):
    d = sim(slots=1, n_ctx=4096)
    r = d.post(COMPLETIONS, json={"model": MODEL, "prompt": "Once upon a time", "max_tokens": 5,
                                  "stream": True}, stream=True, timeout=(T(5), T(15)))
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/event-stream")
    res = read_sse(r)
    assert res.error is None and res.done, (res.error, res.data[-3:])
    chunks = res.chunks()
    assert chunks
    with_choices = [c for c in chunks if c.get("choices")]
    assert with_choices
    for c in chunks:
        assert c["object"] == "text_completion", c
        assert c["id"] == chunks[0]["id"]
    for c in with_choices:
        assert isinstance(c["choices"][0]["text"], str)
    assert "".join(c["choices"][0]["text"] for c in with_choices)
    assert with_choices[-1]["choices"][0]["finish_reason"] in ("length", "stop")
    assert all(c["choices"][0]["finish_reason"] is None for c in with_choices[:-1])


def test_health_matches_capture(sim):
    d = sim()
    r = d.get("/health")
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("application/json")
    assert r.json() == Capture("health.http").json() == {"status": "ok"}


def test_props_and_slots(sim):
    d = sim(slots=2, n_ctx=4096)
    cap = Capture("props.http").json()
    r = d.get("/props")
    assert r.status_code == 200, r.text
    props = r.json()
    assert_shape(props, {"total_slots": 0, "default_generation_settings": {"n_ctx": 0}},
                 mode="superset", what="/props")
    assert_shape(props, cap, mode="compatible", what="/props")
    assert props["total_slots"] == 2
    n_ctx = props["default_generation_settings"]["n_ctx"]
    # Per slot, like llama-server's; --n-ctx may mean per slot or the total (-c).
    assert n_ctx in (4096, 2048), props["default_generation_settings"]

    r = d.get("/slots")
    assert r.status_code == 200, r.text
    slots = r.json()
    cap_slots = Capture("slots.http").json()
    assert_shape(slots, cap_slots[:1], mode="superset", what="/slots")
    assert_shape(slots, cap_slots[1:], mode="compatible", what="/slots")
    assert sorted(s["id"] for s in slots) == [0, 1]
    assert all(s["n_ctx"] == n_ctx for s in slots), slots
    assert not any(s["is_processing"] for s in slots)


def test_slots_show_work(sim):
    d = sim(slots=2, decode_tps=20, time_scale=1)
    box = {}
    t = threading.Thread(target=lambda: box.update(r=post_chat(d, "busy", max_tokens=30, timeout=T(20))))
    t.start()
    try:
        seen = fleet.wait_until(
            lambda: sum(s["is_processing"] for s in d.get("/slots").json()) == 1, T(1.2))
        assert seen, "/slots never showed one slot processing during a 1.5 s request"
    finally:
        t.join(T(20))
    assert box["r"].status_code == 200
    assert not any(s["is_processing"] for s in d.get("/slots").json())


def test_prefill_progress_in_slots_and_status(sim):
    """A long prompt's prefill advances in /slots (n_prompt_tokens_processed) and in the
    agent status's `running` entry, which carries the caller's x-request-id and the
    request's pace; the entry is gone once the answer is."""
    d = sim(slots=1, prefill_tps=1000, decode_tps=100, n_ctx=8192, time_scale=1)
    content = make_prompt(3000, "progress")  # 3 s of prefill
    box = {}
    body = chat_body(content, model=d.model, max_tokens=4)
    t = threading.Thread(target=lambda: box.update(r=d.post(
        CHAT, json=body, timeout=T(20), headers={"x-request-id": "req-progress-1"})))
    t.start()
    try:
        def running():
            return d.get("/agent/v1/status").json()["running"]
        assert fleet.wait_until(lambda: len(running()) == 1 and running()[0]["prompt_done"] > 0, T(2))
        first = running()[0]
        time.sleep(0.5)
        second = running()[0]
        slot = [s for s in d.get("/slots").json() if s["is_processing"]][0]
    finally:
        t.join(T(20))
    assert box["r"].status_code == 200, box["r"].text
    n_prompt = box["r"].json()["usage"]["prompt_tokens"]
    assert first["request_id"] == "req-progress-1", first
    assert first["prompt_tokens"] == n_prompt and first["decoded"] == 0, first
    assert 0 < first["prompt_done"] < second["prompt_done"] < n_prompt, (first, second)
    assert abs(first["prefill_tps"] - 1000) < 50 and first["decode_tps"] is None, first
    assert 0 < slot["n_prompt_tokens_processed"] < slot["n_prompt_tokens"], slot
    assert d.get("/agent/v1/status").json()["running"] == []


def test_models_matches_capture(sim):
    d = sim()
    r = d.get("/v1/models")
    assert r.status_code == 200, r.text
    body = r.json()
    cap = Capture("models.http").json()
    template = {"object": "list", "data": [{"id": "", "object": "", "created": 0, "owned_by": ""}]}
    assert_shape(body, template, mode="superset", what="/v1/models")
    # this capture's build wrote meta.vocab_type as a number, b10587 as a boolean (the
    # sim's, compared with the live b10587 in section 14)
    for x in (body, cap):
        x["data"][0]["meta"].pop("vocab_type")
    assert_shape(body, cap, mode="compatible", what="/v1/models")
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [MODEL]
    assert body["data"][0]["object"] == "model"


def test_metrics_names_and_counts(sim):
    d = sim(slots=2)
    cap = Capture("metrics.http")
    r = d.get("/metrics")
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/plain"), r.headers
    want_types = fleet.prometheus_types(cap.body)
    got_types = fleet.prometheus_types(r.text)
    missing = sorted(set(fleet.parse_prometheus(cap.body)) - set(fleet.parse_prometheus(r.text)))
    assert not missing, f"metrics missing: {missing}"
    wrong = {k: (got_types.get(k), v) for k, v in want_types.items() if got_types.get(k) != v}
    assert not wrong, f"metric types differ (got, capture): {wrong}"
    before = fleet.parse_prometheus(r.text)
    assert before["llamacpp:requests_processing"] == 0
    assert before["llamacpp:requests_deferred"] == 0

    r = post_chat(d, make_prompt(100, "m"), max_tokens=5)
    assert r.status_code == 200
    done = r.json()
    after = d.metrics()
    assert (after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"]
            == done["usage"]["completion_tokens"] >= 1), (before, after)
    assert (after["llamacpp:prompt_tokens_total"] - before["llamacpp:prompt_tokens_total"]
            == done["timings"]["prompt_n"] >= 100), (before, after)
    assert after["llamacpp:requests_processing"] == 0


def test_error_404_matches_capture(sim):
    d = sim()
    for method, path in (("GET", "/no/such/path"), ("POST", "/v1/nothing")):
        r = d.request(method, path, json={} if method == "POST" else None)
        assert r.status_code == 404, (path, r.status_code, r.text)
        assert r.headers["Content-Type"].startswith("application/json")
        assert_shape(r.json(), Capture("error-404.http").json(), what=f"{method} {path}")
        assert r.json()["error"]["type"] == "not_found_error"
        assert r.json()["error"]["code"] == 404


def test_error_badjson_matches_capture(sim):
    d = sim()
    r = d.post(CHAT, data=b'{"messages":', headers={"Content-Type": "application/json"})
    assert r.status_code == 500, r.text
    body = r.json()
    assert_shape(body, Capture("error-badjson.http").json(), what="bad JSON error")
    assert body["error"]["type"] == "server_error" and body["error"]["code"] == 500
    assert body["error"]["message"]
    assert d.get("/health").status_code == 200


def test_error_context_matches_capture(sim):
    """b10587's rule (the default): a prompt of n_ctx tokens or more is refused with 400
    exceed_context_size_error, streamed or not (plain JSON); a prompt that fits is taken
    whatever its cap, and the answer stops at the end of the context ("length")."""
    d = sim(slots=1, n_ctx=1024, prefill_tps=20000, decode_tps=5000)
    cap = Capture("error-context.http").json()
    # prompt (about 1008 tokens) + cap 100 is more than 1024: 16 tokens, then "length"
    content = make_prompt(1000, "too-long")
    r = post_chat(d, content, max_tokens=100)
    assert r.status_code == 200, r.text
    u = r.json()["usage"]
    assert u["prompt_tokens"] + u["completion_tokens"] == 1024, u
    assert r.json()["choices"][0]["finish_reason"] == "length"
    # a prompt longer than the context by itself
    content = make_prompt(1100, "way-too-long")
    for stream in (False, True):
        r = post_chat(d, content, max_tokens=1, stream=stream)
        assert r.status_code == 400 and r.headers["Content-Type"].startswith("application/json"), r.text
        body = r.json()
        assert_shape(body, cap, what="context error")
        e = body["error"]
        assert e["type"] == "exceed_context_size_error" and e["code"] == 400 and e["n_ctx"] == 1024
        n = chatml_tokens(content)
        assert e["n_prompt_tokens"] == n, e
        assert e["message"] == (f"request ({n} tokens) exceeds the available context size (1024 tokens), "
                                "try increasing it"), e
    assert d.metrics()["llamacpp:requests_processing"] == 0
    # the 2025 build cuts such a prompt (whole halves of the context from its front)
    old = sim(slots=1, n_ctx=1024, prefill_tps=20000, decode_tps=5000, extra_args=("--sim-release", "2025"))
    r = post_chat(old, content, max_tokens=4)
    assert r.status_code == 200, r.text
    n = chatml_tokens(content)
    assert r.json()["usage"]["prompt_tokens"] == n - (n - 512) // 512 * 512, r.json()["usage"]


# ------------------------------------------------------------------ 2. fingerprint

def test_system_fingerprint_is_id(sim):
    d = sim(id="pixel-07")
    assert post_chat(d, "hi").json()["system_fingerprint"] == "pixel-07"
    res = read_sse(stream_chat(d, "hi", max_tokens=3))
    assert res.done and {c["system_fingerprint"] for c in res.chunks()} == {"pixel-07"}
    r = d.post(COMPLETIONS, json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert r.json()["system_fingerprint"] == "pixel-07"


# ------------------------------------------------------------------ 3. slots

def test_two_slots_serve_two_and_defer_the_third(sim):
    # each request: 40 tokens at 10 tok/s simulated, time scale 2 -> 2 s
    service = 2.0
    d = sim(slots=2, prefill_tps=5000, decode_tps=10, time_scale=2)
    t0 = time.monotonic()

    def one(i):
        r = post_chat(d, make_prompt(20, f"slot{i}"), max_tokens=40, timeout=T(30))
        return r, time.monotonic() - t0

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        futs = [pool.submit(one, i) for i in range(3)]
        seen = []

        def busy():
            m = d.metrics()
            seen.append((m["llamacpp:requests_processing"], m["llamacpp:requests_deferred"]))
            return seen[-1] == (2, 1)

        observed = fleet.wait_until(busy, T(service * 0.7), interval=0.05)
        results = [f.result(timeout=T(30)) for f in futs]
    assert observed, f"never saw 2 processing and 1 deferred in /metrics: {seen}"
    for r, _ in results:
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 40
    ends = sorted(e for _, e in results)
    assert ends[0] >= service * 0.9, f"faster than the decode rate allows: {ends}"
    assert ends[1] < service + T(1.5), f"the first two did not run at once: {ends}"
    assert ends[2] - ends[1] >= service * 0.7, f"the third did not wait for a slot: {ends}"
    m = d.metrics()
    assert (m["llamacpp:requests_processing"], m["llamacpp:requests_deferred"]) == (0, 0)


# ------------------------------------------------------------------ 4. prefill rate

def test_prefill_rate_and_time_scale(sim):
    # 4,000 tokens at 100 tok/s is 40 s on a phone, 4 s at time scale 10
    d = sim(slots=1, prefill_tps=100, decode_tps=1000, n_ctx=8192, time_scale=10)
    content = make_prompt(4000, "prefill")
    assert len(content) == 16000
    t = time.monotonic()
    r = post_chat(d, content, max_tokens=2, timeout=T(60))
    took = time.monotonic() - t
    assert r.status_code == 200, r.text
    timings = r.json()["timings"]
    assert 4000 <= timings["prompt_n"] <= 4020, timings
    assert timings["cache_n"] == 0
    assert 3.0 <= took <= T(12), f"4,000 tokens at 100 tok/s, scale 10, took {took:.2f} s"
    # timings are wall-clock, as a client (and the gateway learning rates) measures them
    expected_ms = timings["prompt_n"] / (100 * 10) * 1000
    assert 0.75 * expected_ms <= timings["prompt_ms"] <= took * 1000 + 100, timings


# ------------------------------------------------------------------ 5. prefix cache

def test_shared_prefix_is_cached(sim):
    d = sim(slots=1, prefill_tps=1000, decode_tps=1000, n_ctx=8192, time_scale=1)
    a = make_prompt(1000, "cacheA")
    t = time.monotonic()
    r1 = post_chat(d, a, max_tokens=2, timeout=T(30))
    t1 = time.monotonic() - t
    assert r1.status_code == 200, r1.text
    assert r1.json()["timings"]["cache_n"] == 0
    assert t1 >= 0.9, f"1,000 tokens at 1,000 tok/s took only {t1:.2f} s"

    t = time.monotonic()
    r2 = post_chat(d, a + " And now a short question about it?", max_tokens=2, timeout=T(30))
    t2 = time.monotonic() - t
    assert r2.status_code == 200, r2.text
    b2 = r2.json()
    check_usage_and_timings(b2)
    cache_n = b2["timings"]["cache_n"]
    assert 850 <= cache_n < b2["usage"]["prompt_tokens"], b2["timings"]
    assert b2["usage"]["prompt_tokens_details"]["cached_tokens"] == cache_n
    assert t2 < t1 / 2, f"a cached prefix should make it faster: {t1:.2f} s then {t2:.2f} s"


def test_cache_kept_in_its_slot_while_another_slot_works(sim):
    # llama-server picks the idle slot whose cached prompt is most similar, else the least
    # recently used one: an unrelated prompt must not evict A while another slot is free.
    d = sim(slots=2, prefill_tps=20000, decode_tps=2000, n_ctx=8192)
    a, b = make_prompt(1000, "slotA"), make_prompt(1000, "slotB")
    assert post_chat(d, a, max_tokens=2).status_code == 200
    assert post_chat(d, b, max_tokens=2).status_code == 200
    r = post_chat(d, a + " Continue.", max_tokens=2)
    assert r.status_code == 200
    assert r.json()["timings"]["cache_n"] >= 850, r.json()["timings"]


# ------------------------------------------------------------------ 6. faults
# Fault plan times are simulated seconds from the sim's start; at time scale 2 a window
# at real seconds [w0, w0 + dur) is written as at_s = 2 * w0, dur_s = 2 * dur.

SCALE = 2


def plan(kind, w0, dur):
    return [{"at_s": w0 * SCALE, "kind": kind, "dur_s": dur * SCALE}]


def test_fault_offline(sim):
    w0, dur = T(1.5), T(2.0)
    d = sim(slots=1, decode_tps=10, time_scale=SCALE, fault_plan=plan("offline", w0, dur))
    assert d.get("/health").status_code == 200
    # a stream still running when the phone goes offline is cut
    box = {}

    def long_stream():
        try:
            r = stream_chat(d, "a long answer", max_tokens=200, timeout=(T(3), T(10)))
            box["res"] = read_sse(r, timeout=T(15))
        except requests.exceptions.RequestException as e:
            box["err"] = e

    th = threading.Thread(target=long_stream)
    th.start()
    try:
        off = fleet.wait_until(lambda: not fleet.port_accepts(d.port), w0 + dur, interval=0.05)
        t_off = d.elapsed()
        assert off, "connections were never refused during the offline window"
        assert t_off >= w0 - 0.2, f"offline at {t_off:.2f} s, the window starts at {w0:.2f} s"
        assert t_off <= w0 + d.ready_after + T(1.0), f"offline only at {t_off:.2f} s"
    finally:
        th.join(T(20))
    res = box.get("res")
    assert res is not None, f"the stream failed before it started: {box.get('err')}"
    assert res.data, "the stream had started before the window"
    assert not res.done, "a stream open when the phone went offline ended normally"

    back = fleet.wait_until(lambda: fleet.port_accepts(d.port), w0 + dur + T(3), interval=0.05)
    t_on = d.elapsed()
    assert back, "still refusing connections after the window"
    assert t_on >= w0 + dur - 0.25, f"back at {t_on:.2f} s, the window ends at {w0 + dur:.2f} s"
    assert d.get("/health").status_code == 200
    assert post_chat(d, "hello again", max_tokens=2).status_code == 200


def test_fault_hang(sim):
    w0, dur = T(1.0), T(2.5)
    d = sim(slots=2, time_scale=SCALE, fault_plan=plan("hang", w0, dur))
    assert post_chat(d, "before", max_tokens=2).status_code == 200
    assert d.elapsed() < w0, "the sim took too long to start for this test's schedule"
    d.sleep_until(w0 + 0.2)
    with pytest.raises(requests.exceptions.ReadTimeout):
        post_chat(d, "during", max_tokens=2, timeout=(T(1), 1.0))
    d.sleep_until(w0 + dur + 0.3)
    r = post_chat(d, "after", max_tokens=2, timeout=T(5))
    assert r.status_code == 200, r.text


def test_fault_error503(sim):
    w0, dur = T(1.0), T(2.0)
    d = sim(slots=1, time_scale=SCALE, fault_plan=plan("error503", w0, dur))
    assert post_chat(d, "before", max_tokens=2).status_code == 200
    assert d.elapsed() < w0, "the sim took too long to start for this test's schedule"
    d.sleep_until(w0 + 0.2)
    r = post_chat(d, "during", max_tokens=2)
    assert r.status_code == 503, r.text
    assert_shape(r.json(), error_template(), what="503 error")
    assert r.json()["error"]["type"] == "unavailable_error" and r.json()["error"]["code"] == 503
    d.sleep_until(w0 + dur + 0.3)
    r = post_chat(d, "after", max_tokens=2)
    assert r.status_code == 200, r.text


def test_fault_slow(sim):
    # normal: 2,000 tokens at 2,000 tok/s + 40 at 100 tok/s = 1.4 s simulated, 0.7 s real
    w0, dur = T(2.0), T(20.0)
    d = sim(slots=1, prefill_tps=2000, decode_tps=100, n_ctx=8192, time_scale=SCALE,
            fault_plan=plan("slow", w0, dur))
    t = time.monotonic()
    r = post_chat(d, make_prompt(2000, "fast"), max_tokens=40, timeout=T(10))
    normal = time.monotonic() - t
    assert r.status_code == 200, r.text
    assert d.elapsed() < w0, f"the normal request ended inside the window ({normal:.2f} s)"
    d.sleep_until(w0 + 0.2)
    t = time.monotonic()
    r = post_chat(d, make_prompt(2000, "slow"), max_tokens=40, timeout=T(30))
    slow = time.monotonic() - t
    assert r.status_code == 200, r.text
    assert r.json()["timings"]["cache_n"] < 50, "only the ChatML header is shared"
    assert slow >= 3 * normal and slow >= 2.4, f"5x slower? normal {normal:.2f} s, slow {slow:.2f} s"


def test_fault_drop(sim):
    w0, dur = T(1.0), T(4.0)
    d = sim(slots=1, decode_tps=10, time_scale=SCALE, fault_plan=plan("drop", w0, dur))
    res = read_sse(stream_chat(d, "before", max_tokens=3))
    assert res.done and res.error is None, res.data
    assert d.elapsed() < w0, "the sim took too long to start for this test's schedule"
    d.sleep_until(w0 + 0.2)
    # 60 tokens at 20 tok/s real: 3 s, inside the window
    try:
        r = stream_chat(d, "during", max_tokens=60, timeout=(T(3), T(10)))
        assert r.status_code == 200, r.text
        res = read_sse(r, timeout=T(15))
    except requests.exceptions.ConnectionError as e:
        pytest.fail(f"dropped before the answer started, not mid-answer: {e}")
    assert not res.done, "the stream was not cut"
    assert not res.timed_out, "the stream hung instead of being cut"
    assert res.data, "dropped before the answer started, not mid-answer"
    n_content = sum(1 for c in res.chunks() if c.get("choices") and c["choices"][0]["delta"].get("content"))
    assert n_content < 60
    d.sleep_until(w0 + dur + 0.3)
    res = read_sse(stream_chat(d, "after", max_tokens=3))
    assert res.done and res.error is None, res.data


def answer_text(r):
    assert r.status_code == 200, r.text
    m = r.json()["choices"][0]["message"]
    return (m.get("reasoning_content") or "") + (m.get("content") or "")


def test_deterministic_decoding_same_text_on_every_honest_sim(sim):
    """Temperature 0 (greedy), or a seed, gives the same text for the same prompt on every
    honest sim of the model, whatever its speed or slots, as a real engine running one GGUF
    does (issue #32: answers are compared across phones); a longer cap gives the same start.
    Sampling without a seed does not repeat itself."""
    a = sim(slots=1, decode_tps=400)
    b = sim(slots=3, decode_tps=900, prefill_tps=5000)
    for i in range(4):
        prompt = f"Review {i}: card velocity high, new device. Answer RISK_LEVEL 1-5."
        ta = answer_text(post_chat(a, prompt, max_tokens=12, temperature=0, seed=42))
        tb = answer_text(post_chat(b, prompt, max_tokens=12, temperature=0, seed=7))
        assert ta == tb and ta, (ta, tb)
        longer = answer_text(post_chat(b, prompt, max_tokens=20, temperature=0))
        assert longer.startswith(ta), (ta, longer)
        sa = answer_text(post_chat(a, prompt, max_tokens=12, temperature=0.8, seed=5))
        sb = answer_text(post_chat(b, prompt, max_tokens=12, temperature=0.8, seed=5))
        assert sa == sb, (sa, sb)
    other = [answer_text(post_chat(a, "same prompt", max_tokens=12, temperature=0.8)) for _ in range(3)]
    assert len(set(other)) > 1, other


def test_fault_fake_answers_at_once_with_consistent_usage(sim):
    honest = sim(slots=1, decode_tps=20)
    d = sim(slots=1, decode_tps=20, fault_plan=[{"at_s": 0, "kind": "fake", "dur_s": 1e6}])
    t = time.monotonic()
    r = post_chat(d, "Review: refund after chargeback. RISK_LEVEL?", max_tokens=40, temperature=0)
    took = time.monotonic() - t
    assert answer_text(r) == "RISK_LEVEL: 1"
    body = r.json()
    check_usage_and_timings(body)
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] < 40
    assert took < 0.5, f"a faker at 20 tokens/s answered in {took:.2f} s"
    # its timings say how fast it was: as fast as the clock saw
    assert body["timings"]["predicted_ms"] < 100, body["timings"]
    assert answer_text(post_chat(honest, "Review: refund after chargeback. RISK_LEVEL?", max_tokens=8,
                                 temperature=0)) != "RISK_LEVEL: 1"
    res = read_sse(stream_chat(d, "streamed", max_tokens=40))
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in res.chunks() if c.get("choices"))
    assert res.done and text == "RISK_LEVEL: 1", res.data
    rnd = sim(slots=1, fault_plan=[{"at_s": 0, "kind": "fake", "dur_s": 1e6, "random": True}])
    texts = {answer_text(post_chat(rnd, "x", max_tokens=40, temperature=0)) for _ in range(4)}
    assert len(texts) > 1 and all(0 < len(x.split()) <= 8 for x in texts), texts


def test_fault_substitute_answers_differ_deterministically(sim):
    honest = sim(slots=1, decode_tps=400)
    sub = sim(slots=1, decode_tps=400, fault_plan=[{"at_s": 0, "kind": "substitute", "dur_s": 1e6}])
    for i in range(3):
        prompt = f"Review {i}: shipping address differs from billing."
        h = answer_text(post_chat(honest, prompt, max_tokens=10, temperature=0))
        s1 = answer_text(post_chat(sub, prompt, max_tokens=10, temperature=0))
        s2 = answer_text(post_chat(sub, prompt, max_tokens=10, temperature=0))
        assert s1 == s2 and s1 != h, (h, s1, s2)


def test_fault_plan_fake_fields_checked(tmp_path):
    f = tmp_path / "plan.json"
    f.write_text(json.dumps([{"at_s": 0, "kind": "slow", "dur_s": 1, "text": "x"}]))
    p = subprocess.run([str(a) for a in fleet.sim_argv(fleet.free_port(), fault_plan_file=str(f))], capture_output=True,
                       text=True, timeout=T(10), stdin=subprocess.DEVNULL)
    assert p.returncode != 0 and "only a fake window takes it" in p.stderr, p.stderr


# ------------------------------------------------------------------ 7. disconnect

def test_client_disconnect_frees_the_slot(sim):
    d = sim(slots=1, decode_tps=20, time_scale=1)
    body = chat_body("a very long answer please", model=MODEL, max_tokens=400, stream=True)
    req = fleet.http_request_bytes("POST", CHAT, body, port=d.port)
    s = socket.create_connection((fleet.HOST, d.port), timeout=T(5))
    try:
        s.sendall(req)
        got = b""
        deadline = time.monotonic() + T(5)
        while got.count(b"data:") < 3 and time.monotonic() < deadline:
            b = s.recv(4096)
            if not b:
                break
            got += b
        assert got.count(b"data:") >= 3, got[:500]
        assert d.metrics()["llamacpp:requests_processing"] == 1
    finally:
        s.close()
    freed = fleet.wait_until(lambda: d.metrics()["llamacpp:requests_processing"] == 0, T(1.0))
    assert freed, "the slot was still busy 1 s after the client went away"
    t = time.monotonic()
    r = post_chat(d, "next", max_tokens=2, timeout=T(10))
    assert r.status_code == 200
    assert time.monotonic() - t < T(1.5), "the next request waited for the abandoned one"
    assert not any(x["is_processing"] for x in d.get("/slots").json())


# ------------------------------------------------------------------ 8. loading

def test_loading_then_ready(sim):
    loading = T(3.0)  # real seconds; in simulated seconds at time scale 2: twice that
    d = sim(slots=1, loading_s=loading * 2, time_scale=2)
    loading_body = {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}
    r = d.get("/health")
    assert d.elapsed() < loading, "the sim took too long to start for this test"
    assert r.status_code == 503, r.text
    assert r.json() == loading_body
    r = post_chat(d, "too early", max_tokens=2)
    assert r.status_code == 503 and r.json() == loading_body, r.text
    ok = fleet.wait_until(lambda: d.get("/health").status_code == 200, loading + T(5), interval=0.1)
    t_ready = d.elapsed()
    assert ok, "never became ready"
    assert t_ready >= loading - 0.1, f"ready after {t_ready:.2f} s, loading takes {loading} s"
    assert post_chat(d, "now", max_tokens=2).status_code == 200


# ------------------------------------------------------------------ 9. replica token

def test_replica_token(sim):
    d = sim(token="s3cret-t0ken-for-the-sim")
    bodies = {CHAT: chat_body("hi", model=MODEL, max_tokens=2),
              COMPLETIONS: {"model": MODEL, "prompt": "hi", "max_tokens": 2}}
    for path, body in bodies.items():
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer s3cret"},
                        {"Authorization": "Bearer s3cret-t0ken-for-the-sim-and-more"}, {"Authorization": "Bearer s3cret-t0ken"},
                        {"Authorization": "s3cret-t0ken"}):
            r = d.post(path, json=body, auth=False, headers=headers)
            assert r.status_code == 401, (path, headers, r.status_code, r.text)
            assert_shape(r.json(), error_template(), what="401 error")
            assert r.json()["error"]["type"] == "authentication_error"
        r = d.post(path, json=body)  # with the right token
        assert r.status_code == 200, (path, r.text)
    assert d.get("/health", auth=False).status_code == 200


# ------------------------------------------------------------------ 10. bad input

RAW_GARBAGE = [
    b"\x00\x01\x02\xff garbage \r\n\r\n",
    b"GET / HTTP/9.9\r\n\r\n",
    b"NOTAMETHOD /health HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n",
    b"GET /health HTTP/1.1\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(500)) + b"\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"mod",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nxx\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n{}",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
]

BAD_BODIES = [  # each must get a 4xx/5xx with an error body
    b"[1,2,3]", b"null", b'"a string"', b"{}", b'{"model":"sim-model"}',
    b'{"messages":"hi"}', b'{"messages":[]}', b'{"messages":[{"role":1,"content":"x"}]}',
    b'{"messages":[{"role":"user","content":{"nested":true}}]}',
    b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":"ten"}',
    b'{"messages":[{"role":"user","content":"hi"}],"stream":"yes"}',
    b"[" * 100000 + b"]" * 100000,
    b'{"messages":[{"role":"user","content":"hi"}]' + b" " * 10,
]

ODD_BODIES = [  # any answer will do, as long as it is an answer
    b'{"messages":[{"role":"user","content":"\xff\xfe\x00"}],"max_tokens":2}',
    b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":-5}',
    b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":1e308}',
    b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":100000000000000000000000}',
    b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream_options":7}',
    b'{"prompt":["a","b",3],"max_tokens":2}',
]


def test_bad_input_never_crashes(sim):
    d = sim(slots=2, decode_tps=5000, prefill_tps=50000, n_ctx=2048)
    for raw in RAW_GARBAGE:
        got, closed = fleet.raw_exchange(d.port, raw, timeout=T(3), half_close=True)
        status = fleet.http_status(got)
        assert status is None or 400 <= status < 600, (raw[:80], got[:200])
        assert status is not None or closed, f"no answer and no close for {raw[:80]!r}"
        assert d.alive(), f"died on {raw[:80]!r}"
    for body in BAD_BODIES:
        r = d.post(CHAT, data=body, headers={"Content-Type": "application/json"}, timeout=T(5))
        assert 400 <= r.status_code < 600, (body[:80], r.status_code, r.text[:200])
        err = r.json()["error"]
        assert isinstance(err["message"], str) and isinstance(err["type"], str), (body[:80], r.text)
    for body in ODD_BODIES:
        for path in (CHAT, COMPLETIONS):
            r = d.post(path, data=body, headers={"Content-Type": "application/json"}, timeout=T(10))
            assert r.status_code in (200, 400, 500), (path, body[:80], r.status_code)
            if r.status_code != 200:
                assert "error" in r.json(), r.text
    # connections that open and close at once, or send half a request and go
    for i in range(30):
        with socket.create_connection((fleet.HOST, d.port), timeout=T(2)) as s:
            if i % 2:
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Le")
    assert d.alive()
    assert d.get("/health").status_code == 200
    assert post_chat(d, "still there?", max_tokens=2).status_code == 200


def test_request_byte_by_byte_and_pipelined(sim):
    d = sim(slots=1)
    req = fleet.http_request_bytes("POST", CHAT, chat_body("hi", model=MODEL, max_tokens=2),
                                   headers={"Connection": "close"}, port=d.port)
    with socket.create_connection((fleet.HOST, d.port), timeout=T(5)) as s:
        for i in range(len(req)):
            s.sendall(req[i:i + 1])
        got = b""
        for _ in range(1000):
            b = s.recv(65536)
            if not b:
                break
            got += b
    assert fleet.http_status(got) == 200, got[:300]
    assert b'"chat.completion"' in got
    two = (fleet.http_request_bytes("GET", "/health", port=d.port)
           + fleet.http_request_bytes("GET", "/health", headers={"Connection": "close"}, port=d.port))
    got, _ = fleet.raw_exchange(d.port, two, timeout=T(5))
    assert got.count(b"HTTP/1.1 200") == 2, got


# ------------------------------------------------------------------ 11. shutdown

def test_sigterm_exits_zero_promptly(sim):
    d = sim(slots=2)
    assert post_chat(d, "hi", max_tokens=2).status_code == 200
    t = time.monotonic()
    d.send_signal(signal.SIGTERM)
    rc = d.wait_exit(T(5))
    assert rc == 0, f"exit code {rc} after SIGTERM (None: still running after {T(5)} s)"
    assert time.monotonic() - t < T(5)
    assert not fleet.port_accepts(d.port)


def test_sigterm_with_a_request_in_flight(sim):
    d = sim(slots=1, decode_tps=20, time_scale=1)
    r = stream_chat(d, "in flight", max_tokens=20, timeout=(T(3), T(15)))
    assert r.status_code == 200
    first = read_sse(r, stop_after=2)
    assert len(first.data) == 2
    d.send_signal(signal.SIGTERM)
    rest = read_sse(r, timeout=T(15))
    rc = d.wait_exit(T(15))
    assert rc == 0, f"exit code {rc} after SIGTERM with a stream in flight"
    # the answer is either finished or cut, never left hanging
    assert not rest.timed_out, "the stream hung after SIGTERM"


# ------------------------------------------------------------------ 12. refusals
# llama-server (the February 2025 build, --jinja) refuses these with 500 server_error and
# a message that quotes the request; the sim with --sim-release 2025 must say exactly the
# same. Section 14 sends these and more to both real builds and both releases of the sim.

TOOL_NO_DESCRIPTION = {"type": "function", "function": {
    "name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}
HI = [{"role": "user", "content": "hi"}]

# (request body, capture): the requests the captures in fixtures/ answered
CAPTURED_REFUSALS = [
    ({"messages": HI, "n": 2}, "error-n2.http"),
    ({"messages": HI, "tools": [TOOL_NO_DESCRIPTION]}, "error-tools.http"),
    ({"messages": [{"role": "user", "content": 42}]}, "error-content-type.http"),
]

REF_8367 = " (ref: https://github.com/ggml-org/llama.cpp/issues/8367)"

# (path, request body, message): what the real server said to each (captured from it)
OTHER_REFUSALS = [
    (CHAT, {"messages": [{"content": "hi"}]},
     "Failed to parse messages: Missing 'role' in message: {\"content\":\"hi\"}; messages = [\n  {\n"
     "    \"content\": \"hi\"\n  }\n]"),
    (CHAT, {"messages": "hi"},
     "Failed to parse messages: Expected 'messages' to be an array, got \"hi\"; messages = \"hi\""),
    (CHAT, {"messages": [{"role": "user", "content": {"nested": True}}]},
     "Failed to parse messages: Invalid 'content' type: expected string or array, got {\"nested\":true}"
     + REF_8367 + "; messages = [\n  {\n    \"role\": \"user\",\n    \"content\": {\n      \"nested\": true\n"
     "    }\n  }\n]"),
    (CHAT, {"messages": [{"role": "user", "content": [1.5, 3.0, 1e300, 12345678901234567890]}]},
     "Failed to parse messages: Missing content part type: 1.5; messages = [\n  {\n    \"role\": \"user\",\n"
     "    \"content\": [\n      1.5,\n      3.0,\n      1e+300,\n      12345678901234567890\n    ]\n  }\n]"),
    (CHAT, {"model": MODEL},
     "[json.exception.out_of_range.403] key 'messages' not found"),
    (CHAT, {"messages": HI, "tools": [{"type": "function"}]},
     "Failed to parse tools: Missing tool function: {\"type\":\"function\"}; tools = [\n  {\n"
     "    \"type\": \"function\"\n  }\n]"),
    (CHAT, {"messages": HI, "tools": [{"type": "function", "function": {"description": "d", "parameters": {}}}]},
     "Failed to parse tools: [json.exception.out_of_range.403] key 'name' not found; tools = [\n  {\n"
     "    \"type\": \"function\",\n    \"function\": {\n      \"description\": \"d\",\n"
     "      \"parameters\": {}\n    }\n  }\n]"),
    (CHAT, {"messages": HI, "tools": [{"type": "function", "function": {"name": "f", "description": "d"}}]},
     "Failed to parse tools: [json.exception.out_of_range.403] key 'parameters' not found; tools = [\n  {\n"
     "    \"type\": \"function\",\n    \"function\": {\n      \"name\": \"f\",\n      \"description\": \"d\"\n"
     "    }\n  }\n]"),
    (CHAT, {"messages": HI, "tools": [{"type": "function", "function": {
        "name": "f", "description": "d", "parameters": {"type": "object", "properties": {"x": {"type": "bogus"}}}}}]},
     "JSON schema conversion failed:\nUnrecognized schema: {\"type\":\"bogus\"}"),
    (CHAT, {"messages": HI, "tool_choice": "bogus"}, "Invalid tool_choice: bogus"),
    (CHAT, {"messages": HI, "response_format": {"type": "xml"}},
     "response_format type must be one of \"text\" or \"json_object\", but got: xml"),
    (CHAT, {"messages": HI, "top_logprobs": 2}, "top_logprobs requires logprobs to be set to true"),
    (COMPLETIONS, {"prompt": "hi", "n": 2}, "Only one completion choice is allowed"),
    (COMPLETIONS, {"max_tokens": 2}, "\"prompt\" is required"),
    (COMPLETIONS, {"prompt": "hi", "echo": True}, "Unsupported param: echo"),
]


def llama_error_text(status, message):
    """llama-server's error body for an error raised while reading the request."""
    return json.dumps({"error": {"code": status, "message": message, "type": "server_error"}},
                      separators=(",", ":"), ensure_ascii=False)


OLD = ("--sim-release", "2025")  # these captures are the February 2025 build's


@pytest.mark.parametrize("body,capture", CAPTURED_REFUSALS, ids=[c for _, c in CAPTURED_REFUSALS])
def test_refusal_matches_capture(sim, body, capture):
    d = sim(slots=1, extra_args=OLD)
    cap = Capture(capture)
    r = d.post(CHAT, json=body)
    assert r.status_code == cap.status == 500, r.text
    assert r.headers["Content-Type"] == cap.headers["content-type"], r.headers
    assert r.content == cap.body.encode(), f"\n  sim:     {r.text}\n  capture: {cap.body}"
    assert r.headers["Content-Length"] == cap.headers["content-length"]
    # refused before it took a slot: the phone serves the next one at once
    assert d.metrics()["llamacpp:requests_processing"] == 0
    assert post_chat(d, "still fine?", max_tokens=2).status_code == 200


def test_refusals_say_what_llama_server_says(sim):
    d = sim(slots=1, extra_args=OLD)
    for path, body, message in OTHER_REFUSALS:
        r = d.post(path, json=body)
        assert r.status_code == 500, (body, r.status_code, r.text)
        assert r.text == llama_error_text(500, message), f"\n  request: {body}\n  sim:  {r.text}"
    # a 400 where llama-server gives one
    r = d.post(COMPLETIONS, json={"prompt": 5})
    assert r.status_code == 400 and r.json()["error"] == {
        "code": 400, "type": "invalid_request_error",
        "message": "\"prompt\" must be a string, an list of tokens, a list of mixed strings & tokens, "
                   "or a list of prompts"}, r.text
    # what it takes: n 1, values of the wrong type read as the default, tool_choice without tools
    for extra in ({"n": 1}, {"n": "2"}, {"n": True}, {"n": None}, {"tool_choice": "required"},
                  {"tool_choice": 5}, {"tools": []}, {"response_format": {"type": "text"}},
                  {"logprobs": "yes"}):
        r = post_chat(d, "ok", max_tokens=2, **extra)
        assert r.status_code == 200, (extra, r.text)
        assert isinstance(r.json()["choices"][0]["message"]["content"], str), (extra, r.text)
    assert d.get("/health").status_code == 200


def test_mnn_flavour_refuses_in_its_shape(sim):
    d = sim(model="mnn-model", extra_args=("--flavour", "mnn"))
    for body, capture in CAPTURED_REFUSALS:
        r = d.post(CHAT, json=body)
        assert r.status_code == 500, r.text
        assert r.json() == {"error": Capture(capture).json()["error"]["message"]}, r.text
    r = d.post(CHAT, json={"messages": [{"content": "hi"}]})
    assert r.status_code == 500 and r.json()["error"] == OTHER_REFUSALS[0][2], r.text
    assert d.post(CHAT, json=chat_body("fine", model="mnn-model", max_tokens=2)).status_code == 200


# ------------------------------------------------------------------ 13. tool calls, JSON, logprobs

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather at a place",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "detailed": {"type": "boolean"}},
        "required": ["location", "unit", "days"]}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}, "hour24": {"type": "boolean"}}}}}

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "score": {"type": "number", "minimum": 0, "maximum": 1},
    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
    "level": {"enum": ["low", "high"]},
    "nested": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}},
    "required": ["name", "score", "tags", "level", "nested"], "additionalProperties": False}


def validate(value, schema, path="$"):
    """The JSON Schema keywords the tests use (no jsonschema module in Debian's python)."""
    problems = []
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
    t = schema.get("type")
    if t in ("integer", "number"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                (t == "integer" and value != int(value)):
            return [f"{path}: {value!r} is not an {t}"]
        if "minimum" in schema and value < schema["minimum"]:
            problems.append(f"{path}: {value} < minimum")
        if "maximum" in schema and value > schema["maximum"]:
            problems.append(f"{path}: {value} > maximum")
    elif t is not None and not isinstance(value, kinds[t]):
        return [f"{path}: {value!r} is not a {t}"]
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{path}: {value!r} not in {schema['enum']}")
    if isinstance(value, str) and len(value) > schema.get("maxLength", len(value)):
        problems.append(f"{path}: longer than maxLength")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            problems.append(f"{path}: fewer items than minItems")
        for i, v in enumerate(value):
            problems += validate(v, schema.get("items", {}), f"{path}[{i}]")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        problems += [f"{path}: missing {k}" for k in schema.get("required", []) if k not in value]
        if schema.get("additionalProperties") is False:
            problems += [f"{path}: extra {k}" for k in value if k not in props]
        for k, v in value.items():
            if k in props:
                problems += validate(v, props[k], f"{path}.{k}")
    return problems


def check_weather_arguments(args_text):
    args = json.loads(args_text)
    assert not validate(args, WEATHER["function"]["parameters"]), (args, validate(args, WEATHER["function"]["parameters"]))
    assert set(args) == {"location", "unit", "days"}, args  # the required ones only
    return args


def tool_call_deltas(chunks):
    """The delta.tool_calls entries of a stream's chunks, in order."""
    return [tc for c in chunks if c.get("choices") for tc in c["choices"][0]["delta"].get("tool_calls", [])]


def test_tool_call_whole(sim):
    d = sim(slots=1, decode_tps=200)
    r = d.post(CHAT, json={"model": MODEL, "messages": [{"role": "user", "content": "Weather in Oslo?"}],
                           "tools": [WEATHER, CLOCK], "tool_choice": "required"})
    assert r.status_code == 200, r.text
    body = r.json()
    cap = Capture("chat-tools.http").json()
    assert_shape(body["choices"], cap["choices"], what="tool call choices")
    ch = body["choices"][0]
    assert ch["finish_reason"] == "tool_calls"
    msg = ch["message"]
    assert msg["role"] == "assistant" and msg["content"] is None, msg
    assert len(msg["tool_calls"]) == 1, msg
    tc = msg["tool_calls"][0]
    assert tc["type"] == "function" and tc["id"].startswith("call_") and len(tc["id"]) > 8, tc
    assert tc["function"]["name"] == "get_weather", tc  # "required": the first tool
    check_weather_arguments(tc["function"]["arguments"])
    check_usage_and_timings(body)
    assert body["usage"]["completion_tokens"] > 3, body["usage"]
    # a named function is the one called
    r = d.post(CHAT, json={"model": MODEL, "messages": HI, "tools": [WEATHER, CLOCK],
                           "tool_choice": {"type": "function", "function": {"name": "get_time"}}})
    tc = r.json()["choices"][0]["message"]["tool_calls"][0]
    assert tc["function"]["name"] == "get_time", tc
    assert set(json.loads(tc["function"]["arguments"])) == {"zone", "hour24"}, tc  # none required: all
    # "auto" (or no tool_choice): text, as before
    for choice in ({"tool_choice": "auto"}, {}, {"tool_choice": "none"}):
        r = d.post(CHAT, json={"model": MODEL, "messages": HI, "tools": [WEATHER], "max_tokens": 4, **choice})
        ch = r.json()["choices"][0]
        assert isinstance(ch["message"]["content"], str) and "tool_calls" not in ch["message"], (choice, ch)
        assert ch["finish_reason"] == "length", ch


def test_tool_call_stream(sim):
    d = sim(slots=1, decode_tps=200)
    r = d.post(CHAT, json={"model": MODEL, "messages": HI, "tools": [WEATHER], "tool_choice": "required",
                           "stream": True, "stream_options": {"include_usage": True}},
               stream=True, timeout=(T(5), T(15)))
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    res = read_sse(r)
    assert res.error is None and res.done, res.data[-3:]
    chunks = res.chunks()
    role, start, finish, usage = chunks[0], chunks[1], chunks[-2], chunks[-1]
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": None}
    cap_content = [json.loads(x) for x in Capture("chat-stream.http").sse() if x != "[DONE]"][1]
    for c in chunks[1:-2]:
        assert_shape(c, cap_content, mode="compatible", what="tool call chunk")
        assert c["choices"][0]["finish_reason"] is None and set(c["choices"][0]["delta"]) == {"tool_calls"}, c
    first = start["choices"][0]["delta"]["tool_calls"]
    assert first == [{"index": 0, "id": first[0]["id"], "type": "function",
                      "function": {"name": "get_weather", "arguments": ""}}], first
    assert first[0]["id"].startswith("call_")
    pieces = tool_call_deltas(chunks[2:-2])
    assert len(pieces) >= 3 and all(p.keys() == {"index", "function"} and p["index"] == 0 and
                                    p["function"].keys() == {"arguments"} for p in pieces), pieces
    check_weather_arguments("".join(p["function"]["arguments"] for p in pieces))
    assert finish["choices"][0] == {"finish_reason": "tool_calls", "index": 0, "delta": {}}, finish
    assert usage["choices"] == []
    check_usage_and_timings(usage)
    # every piece is a decoded token, and so is the call's start
    assert usage["usage"]["completion_tokens"] == len(pieces) + 1, (usage["usage"], len(pieces))


def test_tool_call_takes_decode_time_and_frees_its_slot(sim):
    d = sim(slots=1, decode_tps=20, time_scale=1)
    body = {"model": MODEL, "messages": HI, "tools": [WEATHER], "tool_choice": "required"}
    t = time.monotonic()
    r = d.post(CHAT, json=body, timeout=T(30))
    took = time.monotonic() - t
    n = r.json()["usage"]["completion_tokens"]
    assert took >= 0.9 * n / 20, f"{n} tokens at 20 tok/s took {took:.2f} s"
    assert r.json()["timings"]["predicted_n"] == n
    # cut by the cap: the arguments so far, finish_reason "length"
    r = d.post(CHAT, json={**body, "max_tokens": 3})
    ch = r.json()["choices"][0]
    assert ch["finish_reason"] == "length" and r.json()["usage"]["completion_tokens"] == 3, r.text
    args = ch["message"]["tool_calls"][0]["function"]["arguments"]
    assert args and not args.endswith("}"), args
    # a client that leaves a streamed call frees the slot
    req = fleet.http_request_bytes("POST", CHAT, {**body, "stream": True}, port=d.port)
    with socket.create_connection((fleet.HOST, d.port), timeout=T(5)) as s:
        s.sendall(req)
        got = b""
        while got.count(b"data:") < 3:
            b = s.recv(4096)
            assert b, got
            got += b
        assert b'"tool_calls"' in got
        assert d.metrics()["llamacpp:requests_processing"] == 1
    assert fleet.wait_until(lambda: d.metrics()["llamacpp:requests_processing"] == 0, T(1.0)), \
        "the slot was still busy 1 s after the client went away"


def test_response_format_json_schema(sim):
    d = sim(slots=1, decode_tps=500)
    rf = {"type": "json_schema", "json_schema": {"name": "review", "schema": SCHEMA}}
    r = d.post(CHAT, json={"model": MODEL, "messages": HI, "response_format": rf})
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    assert ch["finish_reason"] == "stop", ch
    value = json.loads(ch["message"]["content"])
    assert not validate(value, SCHEMA), (value, validate(value, SCHEMA))
    check_usage_and_timings(r.json())
    # streamed: the JSON text split over content deltas
    res = read_sse(d.post(CHAT, json={"model": MODEL, "messages": HI, "response_format": rf, "stream": True},
                          stream=True, timeout=(T(5), T(15))))
    assert res.done, res.data[-3:]
    parts = [c["choices"][0]["delta"].get("content") for c in res.chunks()[1:-1]]
    assert len(parts) > 5 and all(isinstance(p, str) for p in parts), parts
    value = json.loads("".join(parts))
    assert not validate(value, SCHEMA), value
    # json_object: some JSON object
    r = d.post(CHAT, json={"model": MODEL, "messages": HI, "response_format": {"type": "json_object"}})
    assert isinstance(json.loads(r.json()["choices"][0]["message"]["content"]), dict), r.text


def test_logprobs(sim):
    d = sim(slots=1, decode_tps=500)
    r = post_chat(d, "three words", max_tokens=5, logprobs=True, top_logprobs=3)
    assert r.status_code == 200, r.text
    body = r.json()
    cap = Capture("chat-logprobs.http").json()
    assert_shape(body["choices"], cap["choices"], what="choices with logprobs")
    ch = body["choices"][0]
    entries = ch["logprobs"]["content"]
    assert len(entries) == body["usage"]["completion_tokens"] == 5
    assert "".join(e["token"] for e in entries) == ch["message"]["content"]
    for e in entries:
        assert e["bytes"] == list(e["token"].encode()), e
        assert e["logprob"] < 0 and len(e["top_logprobs"]) == 3, e
        assert [t["logprob"] for t in e["top_logprobs"]] == sorted((t["logprob"] for t in e["top_logprobs"]),
                                                                  reverse=True), e
    # without logprobs, no key
    assert "logprobs" not in post_chat(d, "plain", max_tokens=2).json()["choices"][0]
    # streamed: one entry per content chunk, for that chunk's token
    res = read_sse(stream_chat(d, "stream them", max_tokens=4, logprobs=True, top_logprobs=1))
    content = [c for c in res.chunks() if c.get("choices") and c["choices"][0]["delta"].get("content")]
    assert len(content) == 4, res.data
    for c in content:
        lp = c["choices"][0]["logprobs"]["content"]
        assert len(lp) == 1 and lp[0]["token"] == c["choices"][0]["delta"]["content"], c
        assert len(lp[0]["top_logprobs"]) == 1
    # text completions take the legacy count
    r = d.post(COMPLETIONS, json={"model": MODEL, "prompt": "x", "max_tokens": 2, "logprobs": 2})
    ch = r.json()["choices"][0]
    assert len(ch["logprobs"]["content"]) == 2 and len(ch["logprobs"]["content"][0]["top_logprobs"]) == 2, ch


def need_node():
    """node and the openai npm package (fleet.need_node_openai: a skip where they are
    missing, a failure on CI)."""
    fleet.need_node_openai()


def test_openai_npm_client_tool_calls_and_json_schema(sim):
    """The official client reads the sim's tool calls, whole and streamed (deltas put
    together by index), and its response_format json_schema answer."""
    need_node()
    d = sim(slots=2, decode_tps=500)
    out = subprocess.run(["node", str(NODE_DIR / "tools.mjs"), d.url + "/v1", MODEL],
                         capture_output=True, text=True, timeout=T(60), cwd=NODE_DIR)
    assert out.returncode == 0, (out.stdout, out.stderr)
    res = json.loads(out.stdout)
    params = {"type": "object", "required": ["location", "unit"], "properties": {
        "location": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}}}
    for what in ("whole", "stream"):
        a = res[what]
        assert a["finish_reason"] == "tool_calls", (what, a)
        assert len(a["tool_calls"]) == 1, (what, a)
        call = a["tool_calls"][0]
        assert call["id"].startswith("call_") and call["type"] == "function", (what, call)
        assert call["name"] == "get_weather", (what, call)
        args = json.loads(call["arguments"])
        assert not validate(args, params) and set(args) == {"location", "unit"}, (what, args)
    assert res["whole"]["content"] is None
    s = res["stream"]
    assert s["content"] == "" and s["usage"]["completion_tokens"] == s["tool_call_chunks"], s
    st = res["structured"]
    assert st["finish_reason"] == "stop", st
    value = json.loads(st["content"])
    assert not validate(value, st["schema"]), (value, validate(value, st["schema"]))


# ------------------------------------------------------------------ 14. both real engines
# The same requests go to the real llama-servers (February 2025, and b10587 of August 2026
# with its tiny Qwen3.5) and to the sim of each release, started alike (2 slots of 2,048
# tokens); answers are compared byte for byte where a server's words are fixed (refusals),
# and by skeleton (keys in order, JSON types, fixed values) where they carry generated
# text, ids, clocks and token counts. A missing engine skips these tests, or fails them
# under CI=true.

REAL_MODEL = llama.MODEL


def _engine(tmp_path_factory, release):
    try:
        return llama.prepare(tmp_path_factory.mktemp(f"llama-server-{release}"), release)
    except llama.EngineMissing as e:
        if llama.in_ci():
            pytest.fail(f"CI=true and the real llama-server {release} cannot run: {e}", pytrace=False)
        pytest.skip(f"real llama-server {release} not available: {e}")


@pytest.fixture(scope="session")
def engine25(tmp_path_factory):
    return _engine(tmp_path_factory, "2025")


@pytest.fixture(scope="session")
def engine26(tmp_path_factory):
    return _engine(tmp_path_factory, "2026")


@pytest.fixture
def servers(procs, sim, engine25, engine26):
    """Factory: servers(release, *sim_args) -> (real llama-server, sim), both 2 slots of
    2,048 tokens, serving REAL_MODEL."""
    def start(release, *sim_args, slots=2):
        engine = engine25 if release == "2025" else engine26
        real = llama.start(procs, engine, name=f"llama{release}", slots=slots)
        s = sim(model=REAL_MODEL, slots=slots, n_ctx=llama.CTX_PER_SLOT, prefill_tps=500000,
                decode_tps=5000, extra_args=("--sim-release", release, *sim_args), name=f"sim{release}")
        return real, s
    return start


HELLO = [{"role": "user", "content": "Say hello."}]
NO_THINK = enginecmp.NO_THINK
GREEDY = {"temperature": 0}  # the real engines answer the same tokens every time
TOOL_F = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"type": "string"}}}}}

# (path, body): requests that one build or both refuse, each answered by the sim of that
# release with the same status and the same bytes.
REFUSAL_CASES = [
    (CHAT, {"messages": HI, "n": 2, "max_tokens": 2}),
    (CHAT, {"messages": HI, "tools": [TOOL_F], "max_tokens": 2}),
    (CHAT, {"messages": [{"role": "user", "content": 42}]}),
    (CHAT, {"messages": [{"content": "hi"}]}),
    (CHAT, {"messages": "hi"}),
    (CHAT, {"messages": [{"role": "user", "content": {"nested": True}}]}),
    (CHAT, {"messages": [{"role": "user", "content": [1.5, 3.0, 1e300, 12345678901234567890]}]}),
    (CHAT, {"model": MODEL}),
    (CHAT, {"messages": HI, "tools": [{"type": "function"}]}),
    (CHAT, {"messages": HI, "tools": [{"type": "function", "function": {"description": "d", "parameters": {}}}]}),
    (CHAT, {"messages": HI, "tools": [{"type": "function", "function": {"name": "f", "description": "d"}}], "max_tokens": 2}),
    (CHAT, {"messages": HI, "tools": [{"type": "function", "function": {
        "name": "f", "description": "d", "parameters": {"type": "object", "properties": {"x": {"type": "bogus"}}}}}]}),
    (CHAT, {"messages": HI, "tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}}}], "max_tokens": 2}),
    (CHAT, {"messages": HI, "tools": [{"type": "function", "function": {"name": "f", "parameters": "not-a-schema"}}],
            "max_tokens": 2}),
    (CHAT, {"messages": HI, "tool_choice": "bogus", "max_tokens": 2}),
    (CHAT, {"messages": HI, "tool_choice": 5, "max_tokens": 2}),
    (CHAT, {"messages": HI, "response_format": {"type": "xml"}, "max_tokens": 2}),
    (CHAT, {"messages": HI, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "bogus"}}},
            "max_tokens": 2}),
    (CHAT, {"messages": HI, "response_format": {"type": "json_object", "schema": {
        "type": "object", "properties": {"a": {"$ref": "#/$defs/no"}}}}, "max_tokens": 2}),
    (CHAT, {"messages": HI, "top_logprobs": 2, "max_tokens": 2}),
    (CHAT, {"messages": [{"role": 1, "content": "x"}]}),
    (CHAT, {"messages": [{"role": "user", "content": [{"text": "a"}]}]}),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]}),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text"}]}]}),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}),
    (CHAT, {"messages": HI + [{"role": "assistant", "content": None, "tool_calls": [
        {"function": {"name": "f", "arguments": "{}"}}]}], "max_tokens": 2}),
    (CHAT, {"messages": HI + [{"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"arguments": "{}"}}]}], "max_tokens": 2}),
    (CHAT, {"messages": HI + [{"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f"}}]}], "max_tokens": 2}),
    (CHAT, {"messages": [{"role": "user", "content": "hi", "reasoning_content": 5}]}),
    (CHAT, {"messages": [{"role": "assistant"}]}),
    (CHAT, {"messages": [{"role": "system"}]}),
    (CHAT, {"messages": [1]}),
    (CHAT, {"messages": HI, "tools": "x"}),
    (CHAT, {"messages": HI, "tools": [{"function": {}}]}),
    (CHAT, {"messages": HI, "tools": [{"type": "x", "function": {}}]}),
    (CHAT, {"messages": HI, "tools": [{"type": "function", "function": "f"}]}),
    (CHAT, {"messages": HI, "tools": [{"type": "function", "function": {"name": "f", "description": 5}}]}),
    (CHAT, {"messages": HI, "tools": [{"type": "function", "function": {"name": 5}}]}),
    (CHAT, {"messages": HI, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "bogus"}}}], "tool_choice": "none", "max_tokens": 2}),
    (CHAT, {"messages": HI, "tools": [TOOL_F], "grammar": "root ::= \"a\""}),
    (CHAT, {"messages": HI, "tools": [TOOL_F], "stream": True, "max_tokens": 2}),
    (CHAT, {"messages": HI, "tools": [TOOL_F], "logprobs": True, "stream": True}),
    (CHAT, {"messages": HI, "json_schema": {}, "grammar": "root ::= \"a\""}),
    (CHAT, {"messages": HI, "n": 0}),
    (CHAT, {"messages": HI, "n": 3, "max_tokens": 2}),
    (CHAT, {"messages": HI, "n": "2", "max_tokens": 2}),
    (CHAT, {"messages": HI, "n": True, "max_tokens": 2}),
    (CHAT, {"messages": HI, "chat_template_kwargs": {"enable_thinking": "false"}}),
    (CHAT, {"messages": HI, "reasoning_format": "bogus", "max_tokens": 2}),
    (CHAT, {"messages": HI, "reasoning_format": 5, "max_tokens": 2}),
    (CHAT, {"messages": HI + [{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}],
            "max_tokens": 2}),
    (CHAT, {"messages": HI, "continue_final_message": True, "max_tokens": 2}),
    (CHAT, {"messages": HI, "id_slot": "x", "max_tokens": 2}),
    (CHAT, [1, 2, 3]),
    (CHAT, "a string"),
    (CHAT, {}),
    (CHAT, None),
    (COMPLETIONS, {"prompt": "hi", "n": 2, "max_tokens": 2}),
    (COMPLETIONS, {"prompt": "hi", "n": 3, "max_tokens": 2}),
    (COMPLETIONS, {"max_tokens": 2}),
    (COMPLETIONS, {"prompt": "hi", "echo": True, "max_tokens": 2}),
    (COMPLETIONS, {"prompt": "hi", "best_of": 2, "max_tokens": 2}),
    (COMPLETIONS, {"prompt": 5}),
    (COMPLETIONS, {"prompt": {"x": 1}, "max_tokens": 2}),
    ("/v1/responses", {"max_output_tokens": 2}),
    ("/v1/responses", {"input": 5}),
    ("/v1/responses", {"input": "hi", "previous_response_id": "resp_x"}),
    ("/v1/responses", {"input": [{"type": "x"}]}),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_file"}]}]}),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_text"}]}]}),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "x"}]}]}),
    ("/v1/responses", {"input": "hi", "stream": "yes"}),
    ("/v1/responses", {"input": "hi", "tools": "x"}),
    ("/v1/embeddings", {"input": "hi"}),
]
# b10587 only: its typed fields (the 2025 build reads them as their defaults, where the
# sim's own parser is stricter: see docs/sim.md)
REFUSAL_CASES_2026 = [
    (CHAT, {"messages": HI, "stream": "yes"}),
    (CHAT, {"messages": HI, "max_tokens": "ten"}),
    (CHAT, {"messages": HI, "max_tokens": -5}),
    (CHAT, {"messages": HI, "max_completion_tokens": -5}),
    (CHAT, {"messages": HI, "cache_prompt": "no"}),
    (CHAT, {"messages": HI, "stream_options": {"include_usage": "y"}}),
    (COMPLETIONS, {"prompt": [], "max_tokens": 2}),
]


def _refusal_pairs(real, s, cases):
    out = []
    for path, body in cases:
        a = requests.post(real.url + path, json=body, timeout=T(30))
        b = requests.post(s.url + path, json=body, timeout=T(30))
        if a.status_code == 200 and b.status_code == 200:
            continue  # both took it; their answers are compared elsewhere
        if (a.status_code, a.content) != (b.status_code, b.content):
            out.append(f"{path} {json.dumps(body)[:160]}\n    real {a.status_code} {a.text[:400]}\n"
                       f"    sim  {b.status_code} {b.text[:400]}")
    return out


@pytest.mark.parametrize("release", ["2025", "2026"])
def test_refusals_match_the_real_engine(servers, release):
    """Every request of REFUSAL_CASES that either answers with an error gets the same
    status and the same bytes from the sim of that release as from the real build."""
    real, s = servers(release)
    bad = _refusal_pairs(real, s, REFUSAL_CASES + (REFUSAL_CASES_2026 if release == "2026" else []))
    assert not bad, f"{len(bad)} answers differ:\n" + "\n".join(bad)
    # a 2026 refusal the 2025 build does not make, and the other way round, to show the
    # table tells the releases apart
    r = s.post(CHAT, json={"messages": HI, "n": 2, "max_tokens": 2})
    assert r.status_code == (200 if release == "2026" else 500), r.text


def _skeleton_diffs(pairs):
    bad = []
    for real, s, method, path, body in pairs:
        a = enginecmp.answer_skeleton(real.url, method, path, body)
        b = enginecmp.answer_skeleton(s.url, method, path, body)
        if a != b:
            bad.append(f"{method} {path} {json.dumps(body)[:160]}\n    real {a[0]} {json.dumps(a[1])[:1200]}\n"
                       f"    sim  {b[0]} {json.dumps(b[1])[:1200]}")
    return bad


def _shape_cases(think):
    """(method, path, body) whose answers are compared by skeleton; `think` is what a
    chat needs to say for the sim it goes to (b10587's model thinks by default)."""
    chat = [
        {"messages": HELLO, "max_tokens": 3},
        {"messages": HELLO, "max_tokens": 3, "stream": True},
        {"messages": HELLO, "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}},
        {"messages": HELLO, "max_tokens": 2, "logprobs": True, "top_logprobs": 2},
        {"messages": HELLO, "max_tokens": 2, "logprobs": True, "top_logprobs": 2, "stream": True},
    ]
    cmpl = [
        {"prompt": "Say hello.", "max_tokens": 3},
        {"prompt": "Say hello.", "max_tokens": 3, "stream": True},
        {"prompt": "Say hello.", "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}},
        {"prompt": "Say hello.", "max_tokens": 1, "logprobs": 2},
    ]
    return [("POST", CHAT, {**b, **think, **GREEDY}) for b in chat] + [
        ("POST", COMPLETIONS, {**b, **GREEDY}) for b in cmpl] + [
        ("GET", "/props", None),
        ("GET", "/v1/models", None),
        ("GET", "/health", None),
        ("GET", "/no/such/path", None),
    ]


def test_answers_match_the_2025_engine(servers):
    """Whole answers, streams (no role chunk; usage and timings on the last chunk, no
    cache_n), text completions, logprobs, /props, /v1/models, 404s: the 2025 build's
    shapes."""
    real, s = servers("2025")
    bad = _skeleton_diffs([(real, s, m, p, b) for m, p, b in _shape_cases({})])
    assert not bad, f"{len(bad)} answers differ:\n" + "\n".join(bad)


def test_answers_match_the_2026_engine(servers, sim):
    """b10587's shapes: its thinking model's reasoning_content (whole, streamed after the
    role chunk) against a sim started with --thinking; with thinking turned off, content,
    as the default sim answers; "n": 2 whole and streamed (choices 0 and 1, each with its
    own finish, usage and timings); /v1/responses whole and streamed with its named
    events, reasoning and message items; text completions, logprobs, /props, /v1/models."""
    real, thinking = servers("2026", "--thinking")
    plain = sim(model=REAL_MODEL, slots=2, n_ctx=llama.CTX_PER_SLOT, prefill_tps=500000, decode_tps=5000,
                name="sim2026plain")
    pairs = [(real, thinking, m, p, b) for m, p, b in _shape_cases({})]
    pairs += [(real, plain, m, p, b) for m, p, b in _shape_cases(NO_THINK) if p == CHAT]
    n2 = {"messages": HELLO, "max_tokens": 3, "n": 2, **GREEDY}
    for b in (n2, {**n2, "stream": True}, {**n2, "stream": True, "stream_options": {"include_usage": True}}):
        pairs += [(real, thinking, "POST", CHAT, b), (real, plain, "POST", CHAT, {**b, **NO_THINK})]
    pairs.append((real, plain, "POST", COMPLETIONS, {"prompt": "Say hello.", "max_tokens": 3, "n": 2, **GREEDY}))
    resp = {"input": "Say hello.", "max_output_tokens": 3, **GREEDY}
    items = {"input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
             "instructions": "Be terse.", "max_output_tokens": 3, **GREEDY}
    for b in (resp, {**resp, "stream": True}, items):
        pairs += [(real, thinking, "POST", "/v1/responses", b), (real, plain, "POST", "/v1/responses", {**b, **NO_THINK})]
    bad = _skeleton_diffs(pairs)
    assert not bad, f"{len(bad)} answers differ:\n" + "\n".join(bad)


def test_context_limits_match_the_real_engines(servers):
    """b10587 refuses a prompt of 2,048 tokens or more with 400 exceed_context_size_error
    (plain JSON when streamed too) and ends an answer at the end of the context with
    "length"; the 2025 build cuts such a prompt and shifts the context to reach the cap."""
    long_text = make_prompt(3000, "ctx")  # about 3,000 sim tokens, more than 2,048 real ones
    for release in ("2025", "2026"):
        real, s = servers(release)
        for stream in (False, True):
            body = chat_body(long_text, model=REAL_MODEL, max_tokens=4, stream=stream)
            a, b = real.post(CHAT, json=body, timeout=T(60)), s.post(CHAT, json=body, timeout=T(60))
            if release == "2025":
                assert a.status_code == b.status_code == 200, (a.text[:300], b.text[:300])
                continue
            assert a.status_code == b.status_code == 400, (a.text[:300], b.text[:300])
            assert a.content.split(b"(")[0] == b.content.split(b"(")[0] == b'{"error":{"code":400,"message":"request '
            for x in (a, b):  # the token counts are each tokenizer's: checked below
                assert list(x.json()["error"]) == ["code", "message", "type", "n_prompt_tokens", "n_ctx"]
            for r in (a, b):
                e = r.json()["error"]
                assert r.headers["Content-Type"].startswith("application/json")
                assert e["message"] == (f"request ({e['n_prompt_tokens']} tokens) exceeds the available context "
                                        f"size ({e['n_ctx']} tokens), try increasing it"), e
                assert e["n_ctx"] == 2048 and e["n_prompt_tokens"] >= 2048, e
        # a prompt that fits, with a cap past the end of the context
        body = chat_body(make_prompt(1200, "fits"), model=REAL_MODEL, max_tokens=1500, ignore_eos=True,
                         **(NO_THINK if release == "2026" else {}))
        for r in (real.post(CHAT, json=body, timeout=T(120)), s.post(CHAT, json=body, timeout=T(120))):
            assert r.status_code == 200, r.text[:300]
            u, fin = r.json()["usage"], r.json()["choices"][0]["finish_reason"]
            if release == "2026":
                assert u["prompt_tokens"] + u["completion_tokens"] == 2048 and fin == "length", (u, fin)
            else:
                assert u["completion_tokens"] == 1500 and fin == "length", (u, fin)


def _cache_sequence(d, content, slot=0):
    """cache_n of one prompt sent three times to slot `slot`: cache on, "cache_prompt":
    false, cache on again; and the prompt's length."""
    out = []
    for cp in (True, False, True):
        r = d.post(CHAT, json=chat_body(content, model=REAL_MODEL, max_tokens=2, id_slot=slot, cache_prompt=cp,
                                        **NO_THINK), timeout=T(60))
        assert r.status_code == 200, r.text
        out.append(r.json()["timings"].get("cache_n", r.json()["usage"]["prompt_tokens"] - r.json()["timings"]["prompt_n"]))
    return out, r.json()["usage"]["prompt_tokens"]


def test_cache_prompt_false_matches_the_real_engines(servers):
    """"cache_prompt": false reuses nothing on either build. The 2025 build then keeps
    nothing either (the next request reads its whole prompt again); b10587 keeps the prompt
    it read, checkpoints and all (a hybrid model reuses it up to 4 tokens before its end
    on the next request). The sim of each release does the same; 2026 in hybrid mode."""
    content = "You are a careful assistant. " * 40 + "Question?"
    real, s = servers("2025")
    for d in (real, s):
        (first, off, after), n = _cache_sequence(d, content)
        assert (off, after) == (0, 0), (d.name, first, off, after)
    real, s = servers("2026", "--cache-mode", "hybrid")
    for d in (real, s):
        (first, off, after), n = _cache_sequence(d, content)
        assert (off, after) == (0, n - 4), (d.name, first, off, after, n)


def test_hybrid_cache_table_matches_b10587(servers):
    """The README's prompt-cache experiment (A1-H1: one 1,535-token system prompt, new
    questions, a repeated prompt, chats with and without thinking, an exact extension,
    the other slot, edits near the end and the start, no id_slot), as token ids: the real
    b10587 gives the README's cache_n at every step, and the sim in hybrid mode gives
    the real one's."""
    real, s = servers("2026", "--cache-mode", "hybrid")
    rows = enginecmp.CacheExperiment(real.url, s.url).run()
    table = "\n".join(f"  {st}: real {rp} tokens, cache_n {rc}; sim {sp} tokens, cache_n {sc}"
                      for st, rp, rc, sp, sc in rows)
    assert [(st, rp, rc) for st, rp, rc, _, _ in rows] == \
        [(st, *enginecmp.README_TABLE[st]) for st, *_ in rows], "the real engine left the README:\n" + table
    assert [(st, rp, rc) for st, rp, rc, _, _ in rows] == [(st, sp, sc) for st, _, _, sp, sc in rows], \
        "the sim differs from the real engine:\n" + table


# ------------------------------------------------------------------ 15. b10587's behaviours, sim side

def _events(r):
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream"), r.text[:300]
    return enginecmp.sse_events(r.text)


def test_unparsable_fault_is_a_late_500(sim):
    """An answer that ends in an "unparsable" window is b10587's late 500 "The model
    produced output that does not match the expected ... format": whole answers after the
    generation's time, streams as an error event after their tokens (no [DONE]); the
    message names peg-native for a thinking model's chat, Content-only otherwise. Answers
    ending before or after the window, and the 2025 release, are untouched."""
    plan = [{"at_s": 0, "kind": "unparsable", "dur_s": 1e6}]
    d = sim(slots=2, decode_tps=50, fault_plan=plan, extra_args=("--thinking",))
    t = time.monotonic()
    r = post_chat(d, "hi", max_tokens=10)
    assert time.monotonic() - t >= 0.18, "the 500 came before the generation's time"
    assert r.status_code == 500 and r.json() == {"error": {
        "code": 500, "type": "server_error",
        "message": "The model produced output that does not match the expected peg-native format"}}, r.text
    ev = _events(stream_chat(d, "hi", max_tokens=5))
    data = [e for _, e in ev]
    assert "[DONE]" not in data, data
    assert data[-1] == {"error": {"code": 500, "message": "The model produced output that does not match the "
                                  "expected peg-native format", "type": "server_error"}}, data[-1]
    assert sum(1 for x in data[:-1] if x["choices"][0]["delta"].get("reasoning_content")) == 5, data
    r = d.post(COMPLETIONS, json={"model": MODEL, "prompt": "x", "max_tokens": 2})
    assert r.status_code == 500 and "expected Content-only format" in r.json()["error"]["message"], r.text
    assert d.metrics()["llamacpp:requests_processing"] == 0
    old = sim(slots=1, fault_plan=plan, extra_args=OLD)
    assert post_chat(old, "hi", max_tokens=2).status_code == 200


def test_thinking_model(sim):
    """--thinking: a chat's text is reasoning_content, content "" (whole and streamed,
    after the role chunk), counted in usage as completion tokens; a request turns it off
    with chat_template_kwargs enable_thinking false or reasoning_effort "none". Text
    completions, tool calls and JSON answers are not reasoning. Without --thinking the
    kwargs change nothing."""
    d = sim(slots=1, decode_tps=1000, extra_args=("--thinking",))
    body = post_chat(d, "hi", max_tokens=4).json()
    m = body["choices"][0]["message"]
    assert m["content"] == "" and len(m["reasoning_content"].split()) == 4, m
    assert list(m) == ["role", "content", "reasoning_content"], m
    assert body["usage"]["completion_tokens"] == 4, body["usage"]
    chunks = read_sse(stream_chat(d, "hi", max_tokens=3)).chunks()
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    deltas = [c["choices"][0]["delta"] for c in chunks[1:4]]
    assert all(list(x) == ["reasoning_content"] for x in deltas), deltas
    for off in ({"chat_template_kwargs": {"enable_thinking": False}}, {"reasoning_effort": "none"}):
        m = post_chat(d, "hi", max_tokens=2, **off).json()["choices"][0]["message"]
        assert m["content"] and "reasoning_content" not in m, (off, m)
    r = d.post(COMPLETIONS, json={"model": MODEL, "prompt": "x", "max_tokens": 2})
    assert r.json()["choices"][0]["text"], r.text
    r = d.post(CHAT, json={"model": MODEL, "messages": HI, "tools": [WEATHER], "tool_choice": "required"})
    assert r.json()["choices"][0]["message"]["tool_calls"], r.text
    plain = sim(slots=1)
    m = post_chat(plain, "hi", max_tokens=2, chat_template_kwargs={"enable_thinking": True}).json()
    assert "reasoning_content" not in m["choices"][0]["message"], m


def test_n_choices_take_a_slot_each(sim):
    """"n": 2 (b10587) answers two choices, index 0 and 1, generated at once on two slots
    (a child task each, as llama-server runs them): /slots shows both at work; usage is
    the first choice's; n above the slot count is refused before any slot is taken."""
    d = sim(slots=2, decode_tps=20, time_scale=1)
    box = {}
    th = threading.Thread(target=lambda: box.update(r=post_chat(d, "two", max_tokens=20, n=2, timeout=T(20))))
    th.start()
    try:
        both = fleet.wait_until(lambda: sum(s["is_processing"] for s in d.get("/slots").json()) == 2, T(0.8))
    finally:
        th.join(T(20))
    assert both, "/slots never showed the two choices' slots at work"
    body = box["r"].json()
    assert [c["index"] for c in body["choices"]] == [0, 1], body
    assert all(c["finish_reason"] == "length" for c in body["choices"])
    assert body["choices"][0]["message"]["content"] != body["choices"][1]["message"]["content"]
    assert body["usage"]["completion_tokens"] == 20, body["usage"]
    r = post_chat(d, "three", max_tokens=2, n=3)
    assert r.status_code == 400 and r.json()["error"]["message"] == \
        "Field 'n': Value must be between 1 <= value <= 2, but got 3", r.text
    # streamed: each choice its role chunk, its tokens, its finish (and usage) chunk
    chunks = read_sse(stream_chat(d, "two", max_tokens=3, n=2, include_usage=True)).chunks()
    for i in (0, 1):
        mine = [c for c in chunks if c["choices"] and c["choices"][0]["index"] == i]
        assert mine[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
        assert mine[-1]["choices"][0]["finish_reason"] == "length"
        assert sum(1 for c in mine if c["choices"][0]["delta"].get("content")) == 3
    assert sum(1 for c in chunks if not c["choices"]) == 2  # a usage chunk per choice


def test_responses_api(sim):
    """POST /v1/responses (b10587): whole, a "response" with a message item (or a
    reasoning item for a thinking model) and usage; streamed, its named events in order;
    a required tool call is a function_call item; the 2025 release answers 404."""
    d = sim(slots=1, decode_tps=1000)
    r = d.post("/v1/responses", json={"model": MODEL, "input": "Say hello.", "max_output_tokens": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "response" and body["status"] == "completed" and body["id"].startswith("resp_")
    (item,) = body["output"]
    assert item["type"] == "message" and item["id"].startswith("msg_") and item["content"][0]["text"], item
    assert body["usage"]["output_tokens"] == 3 and body["usage"]["input_tokens_details"]["cached_tokens"] == 0
    names = [n for n, _ in _events(d.post("/v1/responses", json={"model": MODEL, "input": "Hi",
                                                                 "max_output_tokens": 2, "stream": True}))]
    assert names == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
                     "response.output_text.done", "response.content_part.done", "response.output_item.done",
                     "response.completed"], names
    tool = {"type": "function", "name": "get_weather", "description": "w",
            "parameters": WEATHER["function"]["parameters"]}
    body = d.post("/v1/responses", json={"model": MODEL, "input": "Oslo?", "tools": [tool],
                                         "tool_choice": "required"}).json()
    (call,) = body["output"]
    assert call["type"] == "function_call" and call["name"] == "get_weather", call
    assert call["id"] == "fc_" + call["call_id"][len("call_"):], call
    check_weather_arguments(call["arguments"])
    ev = _events(d.post("/v1/responses", json={"model": MODEL, "input": "Oslo?", "tools": [tool],
                                               "tool_choice": "required", "stream": True}))
    names = [n for n, _ in ev]
    assert names[2] == "response.output_item.added" and ev[2][1]["item"]["type"] == "function_call", ev[2]
    args = "".join(e["delta"] for n, e in ev if n == "response.function_call_arguments.delta")
    check_weather_arguments(args)
    assert names[-2:] == ["response.output_item.done", "response.completed"], names
    thinking = sim(slots=1, decode_tps=1000, extra_args=("--thinking",))
    body = thinking.post("/v1/responses", json={"model": MODEL, "input": "Hi", "max_output_tokens": 2}).json()
    assert [o["type"] for o in body["output"]] == ["reasoning"], body
    old = sim(slots=1, extra_args=OLD)
    assert old.post("/v1/responses", json={"model": MODEL, "input": "Hi"}).status_code == 404


def test_hybrid_cache_mode_on_chats(sim):
    """--cache-mode hybrid on the sim's own chats (ChatML, characters / 4): a new
    question after the same system prompt reuses up to the last user turn's start; the
    same prompt again, all but its last 4 tokens; a prompt that shares only its first
    tokens, nothing; "id_slot" pins a slot; "cache_prompt": false reuses nothing and the
    slot keeps the new prompt. Its status says its cache stops at checkpoints, as the
    agent's probe finds on b10587 (the gateway predicts it so); in full mode it does not."""
    d = sim(slots=2, prefill_tps=50000, decode_tps=2000, extra_args=("--cache-mode", "hybrid"))
    assert d.get("/agent/v1/status").json()["engine_features"]["cache_checkpoints"] is True
    full = sim(slots=2, prefill_tps=50000, decode_tps=2000)
    assert full.get("/agent/v1/status").json()["engine_features"]["cache_checkpoints"] is False
    system = make_prompt(600, "sys")

    def ask(question, **kw):
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        r = d.post(CHAT, json={"model": MODEL, "messages": msgs, "max_tokens": 2, "id_slot": 0, **kw})
        assert r.status_code == 200, r.text
        return r.json()["timings"]["cache_n"], r.json()["usage"]["prompt_tokens"]

    user_at = len(f"<|im_start|>system\n{system}<|im_end|>\n") // 4
    assert ask("First question?")[0] == 0
    assert ask("A second question?")[0] == user_at
    c, n = ask("A second question?")
    assert c == n - 4, (c, n)
    c, n = ask("Third?", cache_prompt=False)
    assert c == 0
    assert ask("Third?")[0] == n - 4
    other = d.post(CHAT, json={"model": MODEL, "messages": [{"role": "user", "content": system}],
                               "max_tokens": 2, "id_slot": 0})
    assert other.json()["timings"]["cache_n"] == 0, other.json()["timings"]


def test_cache_prompt_false_in_full_mode(sim):
    """A transformer (the default): "cache_prompt": false reuses nothing; the 2026
    release's slot then holds that prompt (the next request reuses all but its last
    token), the 2025 release's holds nothing."""
    content = make_prompt(300, "cp")
    for release, after in (("2026", 1), ("2025", None)):
        d = sim(slots=1, prefill_tps=50000, decode_tps=2000, extra_args=("--sim-release", release))
        got = []
        for cp in (True, False, True):
            r = post_chat(d, content, max_tokens=2, cache_prompt=cp)
            t = r.json()["timings"]
            got.append(t.get("cache_n", r.json()["usage"]["prompt_tokens"] - t["prompt_n"]))
        n = r.json()["usage"]["prompt_tokens"]
        assert got[1] == 0 and got[2] == (n - 1 if after else 0), (release, got, n)


def test_ram_prompt_cache(sim):
    """The 2026 release's RAM prompt cache: a slot is saved there before llama-server
    reuses it for an unrelated prompt (the least recently used one), and a later prompt
    that shares most of it gets it back; --cache-ram 0 turns it off."""
    a, b = make_prompt(800, "ramA"), make_prompt(800, "ramB")
    for ram, want in (("131072", True), ("0", False)):
        d = sim(slots=1, prefill_tps=50000, decode_tps=2000, extra_args=("--cache-ram", ram))
        assert post_chat(d, a, max_tokens=2).status_code == 200
        assert post_chat(d, b, max_tokens=2).status_code == 200  # the only slot: a goes to RAM
        c = post_chat(d, a + " More?", max_tokens=2).json()["timings"]["cache_n"]
        assert (c > 750) == want, (ram, c)
