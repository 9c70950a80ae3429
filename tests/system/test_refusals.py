"""A request that a phone refuses is the request's fault (docs/routing.md "Phone failures
and request errors"): the caller gets a fast 400 with the phone's reason, no phone leaves
rotation or is charged, and only phone failures count as failures. The phones here are
scripted (gwutil.ScriptedPhone) so each kind of answer can be made exactly; the same
behaviour against the real llama-server is in test_llama.py, against the sim in
test_sim.py and at the end of this file."""

import json
import threading
import time

import pytest
import requests

import fleet
import gwutil as g
from fleet import T, wait_until
from gwutil import MODEL, ScriptedPhone, chunk, completion
from test_admin import start as start_admin

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"type": "string"}}}}}]


@pytest.fixture
def scripted():
    """Factory: scripted(answer, id) starts a ScriptedPhone; all are closed at the end."""
    phones = []

    def start(answer, id):
        p = ScriptedPhone(answer, id=id)
        phones.append(p)
        return p

    yield start
    for p in phones:
        p.close()


def rep(p, slots=2, prefill_tps=5000, decode_tps=500, **over):
    r = {"id": p.id, "url": p.url, "models": [MODEL], "slots": slots,
         "prefill_tps": prefill_tps, "decode_tps": decode_tps}
    r.update(over)
    return r


def counters(adm):
    m = adm.metrics()
    fails = sum(v for k, v in m.items() if k.startswith("fleetgate_upstream_failures_total"))
    refusals = {k: v for k, v in m.items() if k.startswith("fleetgate_request_refusals_total")}
    return fails, refusals, m.get("fleetgate_refusal_checks_total", 0)


def all_ready(adm, ids):
    reps = adm.replicas()
    return {i: (reps[i]["state"], reps[i]["failures"]) for i in ids}


def post(d, body, stream=False, timeout=None):
    return d.post(g.CHAT, json=body, stream=stream, timeout=timeout or T(20))


def body(**kw):
    b = fleet.chat_body("Hello", model=MODEL, max_tokens=8)
    b.update(kw)
    return b


# ---------------------------------------------------------------------------- refusals

def test_a_refusal_from_two_phones_is_a_fast_400_and_charges_neither(scripted, gateway):
    refuse = lambda b, n: (500, g.LLAMA_TOOLS)  # noqa: E731
    a, b = scripted(refuse, "a"), scripted(refuse, "b")
    d, adm = start_admin(gateway, [rep(a), rep(b)])
    t0 = time.monotonic()
    r = post(d, body(tools=TOOLS))
    took = time.monotonic() - t0
    e = g.check_error(r, 400, code="request_refused", what="refused twice")
    assert took < T(5), took
    assert e["type"] == "invalid_request_error", e
    assert "Failed to parse tools" in e["message"], e
    assert r.headers.get("x-fleetgate-replica") in ("a", "b"), dict(r.headers)
    assert a.n + b.n == 2 and a.n == 1 and b.n == 1, (a.n, b.n)  # one second opinion, no storm
    log = g.access_log(d, r.headers["x-request-id"])
    assert log["refused"] == "request_refused" and log["refused_by"] in ("a", "b"), log
    assert log["status"] == 400, log
    # many more: with health.fall 2 a single charge each would have taken both down
    for _ in range(8):
        r = post(d, body(tools=TOOLS))
        g.check_error(r, 400, code="request_refused")
    assert all_ready(adm, ["a", "b"]) == {"a": ("ready", 0), "b": ("ready", 0)}
    fails, refusals, checks = counters(adm)
    assert fails == 0, fails
    assert refusals == {'fleetgate_request_refusals_total{source="replica",code="request_refused"}': 9}, refusals
    assert checks == 9, checks
    # and they still serve everyone else at once
    assert a.n + b.n == 18


def test_one_phones_refusal_is_checked_on_another_that_answers(scripted, gateway):
    a = scripted(lambda b, n: (500, g.LLAMA_TOOLS), "a")
    b = scripted(lambda body, n: (200, completion("fine")), "b")
    # a is much faster, so the planner always tries it first
    d, adm = start_admin(gateway, [rep(a, prefill_tps=50000, decode_tps=5000), rep(b)])
    for _ in range(5):
        r = post(d, body())
        assert r.status_code == 200, r.text
        assert r.headers["x-fleetgate-replica"] == "b", dict(r.headers)
        assert r.json()["choices"][0]["message"]["content"] == "fine"
    assert a.n == 5 and b.n == 5, (a.n, b.n)
    # a is never charged, nor credited: it stays ready with no failure
    assert all_ready(adm, ["a", "b"]) == {"a": ("ready", 0), "b": ("ready", 0)}
    fails, refusals, checks = counters(adm)
    assert fails == 0 and refusals == {} and checks == 5, (fails, refusals, checks)


def test_a_single_phones_refusal_is_answered_at_once(scripted, gateway):
    a = scripted(lambda b, n: (500, {"error": "Only one completion choice is allowed"}), "a")  # MNN's shape
    d, adm = start_admin(gateway, [rep(a)])
    t0 = time.monotonic()
    r = post(d, body())
    e = g.check_error(r, 400, code="request_refused")
    assert time.monotonic() - t0 < T(3)
    assert e["message"] == "Only one completion choice is allowed", e
    assert a.n == 1
    assert all_ready(adm, ["a"]) == {"a": ("ready", 0)}
    fails, _, checks = counters(adm)
    assert fails == 0 and checks == 0, (fails, checks)


def test_a_4xx_refusal_is_final_and_keeps_its_status(scripted, gateway):
    a = scripted(lambda b, n: (400, g.LLAMA_CONTEXT), "a")
    b = scripted(lambda b, n: (200, completion()), "b")
    # (trust_after_answers 0: every phone has a record; a refusal from one without is
    # asked of another, test_attack_answers.py)
    d, adm = start_admin(gateway, [rep(a, prefill_tps=50000, decode_tps=5000), rep(b)],
                         scheduler={"trust_after_answers": 0})
    r = post(d, body())
    e = g.check_error(r, 400, code="context_length_exceeded")
    # OpenAI's words with the engine's numbers; b says no context, so nothing holds it more
    assert e["message"].startswith("This model's maximum context length is 2048 tokens. "), e
    assert e["param"] == "messages", e
    assert (a.n, b.n) == (1, 0)
    a2 = scripted(lambda b, n: (422, {"error": {"message": "bad grammar", "type": "invalid_request_error",
                                                "param": "response_format", "code": "x"}}), "a2")
    d2, adm2 = start_admin(gateway, [rep(a2)])
    e = g.check_error(post(d2, body()), 422, code="request_refused")
    assert e["param"] == "response_format" and e["message"] == "bad grammar", e
    assert counters(adm)[0] == 0 and counters(adm2)[0] == 0


@pytest.mark.parametrize("kind", ["late", "html", "502"])
def test_phone_failures_still_mark_the_phone_and_retry(scripted, gateway, kind):
    answers = {
        "late": lambda b, n: (500, g.LLAMA_TOOLS, 1.0),   # past refusal_window_s
        "html": lambda b, n: (500, "<html><h1>500 Internal Server Error</h1></html>"),
        "502": lambda b, n: (502, g.LLAMA_TOOLS),
    }
    a = scripted(answers[kind], "a")
    b = scripted(lambda body, n: (200, completion("from b")), "b")
    # hedge_min_s 30: the late answer (1 s) would otherwise race a hedge of this short
    # request (overdue after its ~0 s prediction + hedge_min_s / 2 = 1 s), whose win
    # cancels the attempt on a before its 500 can charge it
    d, adm = start_admin(gateway, [rep(a, prefill_tps=50000, decode_tps=5000), rep(b)],
                         upstream={"refusal_window_s": 0.4}, scheduler={"hedge_min_s": 30})
    r = post(d, body())
    assert r.status_code == 200, r.text
    assert r.headers["x-fleetgate-replica"] == "b"
    assert a.n == 1
    state = all_ready(adm, ["a"])["a"]
    assert state[1] == 1, state  # charged
    m = adm.metrics()
    assert m['fleetgate_upstream_failures_total{reason="status"}'] == 1, m
    assert counters(adm)[2] == 0


def test_a_refusal_sent_as_the_first_stream_event_is_a_plain_400(scripted, gateway):
    ev = {"error": {"code": 500, "message": "Cannot use tools with stream", "type": "server_error"}}
    refuse = lambda b, n: ("stream", [ev])  # noqa: E731
    a, b = scripted(refuse, "a"), scripted(refuse, "b")
    d, adm = start_admin(gateway, [rep(a), rep(b)])
    r = post(d, body(stream=True, tools=TOOLS), stream=True)
    e = g.check_error(r, 400, code="request_refused")
    assert e["message"] == "Cannot use tools with stream", e
    assert (a.n, b.n) == (1, 1)
    assert counters(adm)[0] == 0
    assert all_ready(adm, ["a", "b"]) == {"a": ("ready", 0), "b": ("ready", 0)}


def test_an_error_event_mid_stream_continues_on_another_phone_uncharged(scripted, gateway):
    err = {"error": {"code": 500, "message": "something about this request", "type": "server_error"}}
    a = scripted(lambda b, n: ("stream", [chunk({"role": "assistant", "content": None}),
                                          chunk({"content": "Hello"}), 0.05, err]), "a")
    b = scripted(lambda body, n: ("stream", [chunk({"role": "assistant", "content": None}),
                                             chunk({"content": " world"}),
                                             chunk({}, finish="stop"), "[DONE]"]), "b")
    d, adm = start_admin(gateway, [rep(a, prefill_tps=50000, decode_tps=5000), rep(b)])
    r = post(d, body(stream=True), stream=True)
    assert r.status_code == 200
    res = fleet.read_sse(r, timeout=T(10))
    text = "".join((c["choices"][0]["delta"].get("content") or "") for c in res.chunks() if c.get("choices"))
    assert text == "Hello world", res.events
    assert res.done, res.events
    assert b.requests[0]["messages"][-1] == {"role": "assistant", "content": "Hello"}, b.requests[0]
    assert counters(adm)[0] == 0 and counters(adm)[2] == 1
    assert all_ready(adm, ["a", "b"]) == {"a": ("ready", 0), "b": ("ready", 0)}


def test_a_stream_broken_inside_a_tool_call_is_not_continued(scripted, gateway):
    call = {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                            "function": {"name": "f", "arguments": "{\"x\": \"a"}}]}
    # the phone drops the stream (no [DONE]) halfway through a function call's arguments
    a = scripted(lambda b, n: ("stream", [chunk({"role": "assistant", "content": None}), chunk(call)]), "a")
    b = scripted(lambda body, n: (200, completion()), "b")
    d, adm = start_admin(gateway, [rep(a, prefill_tps=50000, decode_tps=5000), rep(b)])
    r = post(d, body(stream=True, tools=TOOLS, tool_choice="required"), stream=True)
    assert r.status_code == 200
    res = fleet.read_sse(r, timeout=T(10))
    assert not res.done, res.events
    got = [c for c in res.chunks() if c.get("choices")]
    assert got and got[-1]["choices"][0]["delta"] == call, res.events  # passed through unchanged
    assert res.chunks()[-1].get("error", {}).get("code") == "upstream_stream_error", res.events
    assert b.n == 0


# ---------------------------------------------------------------------------- timeouts

def test_a_request_that_times_out_on_two_phones_charges_the_second_not(scripted, gateway):
    hang = lambda b, n: (200, completion(), 3.0)  # noqa: E731
    a, b = scripted(hang, "a"), scripted(hang, "b")
    d, adm = start_admin(gateway, [rep(a, prefill_tps=50000, decode_tps=5000), rep(b)],
                         upstream={"timeout_margin": 1, "timeout_min_s": 0.4})
    r = post(d, body())
    e = g.check_error(r, 504, code="request_timeout")
    assert "timed out on two replicas" in e["message"], e
    states = all_ready(adm, ["a", "b"])
    assert sorted(v[1] for v in states.values()) == [0, 1], states  # only the first phone
    m = adm.metrics()
    assert m['fleetgate_upstream_failures_total{reason="timeout"}'] == 1, m
    assert m['fleetgate_request_refusals_total{source="replica",code="request_timeout"}'] == 1, m


def test_the_whole_answer_watchdog_follows_the_requests_own_cap(scripted, gateway):
    # the phone decodes 100 tokens/s and writes the whole cap
    def answer(b, n):
        cap = b["max_tokens"]
        return (200, completion("x" * cap, tokens=cap), cap / 100)
    a = scripted(answer, "a")
    d, adm = start_admin(gateway, [rep(a, slots=4, prefill_tps=100000, decode_tps=100)],
                         upstream={"timeout_margin": 1.5, "timeout_min_s": 0.3})
    # fifty one-token answers would shrink a fleet-wide expected answer length to ~1
    for _ in range(50):
        assert post(d, body(max_tokens=1)).status_code == 200
    r = post(d, body(max_tokens=150))  # 1.5 s of honest work
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 150
    assert all_ready(adm, ["a"]) == {"a": ("ready", 0)}
    assert counters(adm)[0] == 0


# ---------------------------------------------------------------------------- the gateway's own

def test_the_gateway_refuses_what_every_phone_would_before_any_is_used(scripted, gateway):
    a = scripted(lambda b, n: (200, completion()), "a")
    d, adm = start_admin(gateway, [rep(a)])
    e = g.check_error(post(d, body(n=2)), 400, code="unsupported_value")
    assert e["param"] == "n", e
    e = g.check_error(post(d, body(tools=[{"type": "function", "function": {"description": "d"}}])),
                      400, code="missing_required_parameter")
    assert e["param"] == "tools[0].function.name", e
    e = g.check_error(post(d, {"model": MODEL, "messages": [{"role": "user", "content": 42}]}),
                      400, code="invalid_type")
    assert e["param"] == "messages[0].content", e
    assert a.n == 0
    # n = 1 and every OpenAI feature go through unchanged
    feats = dict(n=1, tools=TOOLS, tool_choice="auto", response_format={"type": "json_object"},
                 logprobs=True, top_logprobs=2, stop=["\n"], seed=7, temperature=0.2, top_p=0.9,
                 user="u-1", presence_penalty=0.1)
    assert post(d, body(**feats)).status_code == 200
    sent = a.requests[0]
    for k, v in feats.items():
        assert sent[k] == v, (k, sent)
    m = adm.metrics()
    assert m['fleetgate_request_refusals_total{source="gateway",code="unsupported_value"}'] == 1
    assert m['fleetgate_request_refusals_total{source="gateway",code="invalid_type"}'] == 1


def test_models_retrieve(sim, gateway):
    p = g.phone(sim, "p1")
    d = g.start_gateway(gateway, [g.replica(p)])
    r = d.get(f"/v1/models/{MODEL}")
    assert r.status_code == 200, r.text
    assert r.json() == {"id": MODEL, "object": "model", "created": 0, "owned_by": "fleetgate"}
    e = g.check_error(d.get("/v1/models/nope"), 404, code="model_not_found")
    assert e["param"] == "model"
    g.check_error(d.post(f"/v1/models/{MODEL}", json={}), 405, code="method_not_allowed")


def test_slots_and_context_are_learned_when_the_config_leaves_them_out(sim, gateway):
    p = sim(slots=3, n_ctx=4096, id="lp", name="lp")
    r = {"id": "lp", "url": p.url, "models": ["sim-model"]}
    d, adm = start_admin(gateway, [r])
    wait_until(lambda: adm.replicas()["lp"]["slots"] == 3, T(5), what="slots from /props")
    assert adm.replicas()["lp"]["n_ctx"] == 4096  # the sim's n_ctx is per slot


# ---------------------------------------------------------------------------- the sim

BAD_TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"type": "string"}}}}}]  # no description


def test_refused_requests_amid_load_on_three_sims(sim, gateway):
    """The issue's headline with the sim (test_llama.py has it with the real engine): 30
    ordinary requests in flight, 6 that llama-server refuses, each answered in under 5 s
    with a 400 carrying the reason; all 30 succeed; no phone leaves rotation. The sims
    answer like the February 2025 build (--sim-release 2025): b10587 takes a tool
    without a description."""
    phones = [g.phone(sim, f"s{i}", slots=2, prefill_tps=500, decode_tps=20,
                      extra_args=("--sim-release", "2025")) for i in range(3)]
    d, adm = start_admin(gateway, [g.replica(p) for p in phones])
    states, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            try:
                states.append({k: v["state"] for k, v in adm.replicas().items()})
            except requests.RequestException:
                pass
            stop.wait(0.1)

    def ordinary(i):
        return post(d, body(max_tokens=24, messages=[{"role": "user", "content": f"review {i}"}]),
                    timeout=T(60))

    bad = [dict(tools=BAD_TOOLS), dict(tools=BAD_TOOLS), dict(n=2), dict(n=2),
           dict(messages=[{"role": "user", "content": 42}]),
           dict(messages=[{"role": "user", "content": 42}])]
    results = {}

    def refused(k):
        t0 = time.monotonic()
        r = post(d, body(**bad[k]))
        results[k] = (r, time.monotonic() - t0)

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    ords = [None] * 30
    ths = [threading.Thread(target=lambda i=i: ords.__setitem__(i, ordinary(i))) for i in range(30)]
    for t in ths:
        t.start()
    time.sleep(0.3)  # the ordinary ones hold every slot and queue
    bts = [threading.Thread(target=refused, args=(k,)) for k in range(len(bad))]
    for t in bts:
        t.start()
    for t in bts + ths:
        t.join(T(90))
    stop.set()
    w.join(5)
    for k, (r, took) in results.items():
        e = g.check_error(r, 400, what=f"refused {bad[k]}")
        assert took < T(5), (bad[k], took)
        assert e["type"] == "invalid_request_error" and e["message"], e
        if "tools" in bad[k]:
            assert e["code"] == "request_refused" and "Failed to parse tools" in e["message"], e
    assert len(results) == 6
    assert [r.status_code for r in ords] == [200] * 30, [r.status_code for r in ords]
    in_rotation = {"ready", "busy"}  # the admin API says busy for a ready phone at work
    assert states and all(set(s.values()) <= in_rotation for s in states), \
        [s for s in states if not set(s.values()) <= in_rotation][:3]
    assert not g.log_msgs(d, "replica state changed", to="down")
    fails, refusals, _ = counters(adm)
    assert fails == 0, fails
    assert refusals['fleetgate_request_refusals_total{source="replica",code="request_refused"}'] == 2, refusals


def test_openai_npm_client_tools_through_the_gateway(sim, gateway):
    """The official client's tools API (whole and streamed tool calls) and
    response_format json_schema, through the gateway to the sim, and a model lookup."""
    from test_sim import NODE_DIR, need_node, validate  # noqa: PLC0415
    need_node()
    p = g.phone(sim, "t1", slots=2, prefill_tps=500, decode_tps=50)
    d = g.start_gateway(gateway, [g.replica(p)])
    import subprocess  # noqa: PLC0415
    out = subprocess.run(["node", str(NODE_DIR / "tools.mjs"), d.url + "/v1", MODEL],
                         capture_output=True, text=True, timeout=T(60), cwd=NODE_DIR)
    assert out.returncode == 0, (out.stdout, out.stderr)
    res = json.loads(out.stdout)
    for what in ("whole", "stream"):
        a = res[what]
        assert a["finish_reason"] == "tool_calls", (what, a)
        call = a["tool_calls"][0]
        assert call["id"].startswith("call_") and call["name"] == "get_weather", (what, call)
        args = json.loads(call["arguments"])
        assert set(args) == {"location", "unit"}, (what, args)
    st = res["structured"]
    assert not validate(json.loads(st["content"]), st["schema"]), st
    r = d.get(f"/v1/models/{MODEL}")
    assert r.status_code == 200 and r.json()["id"] == MODEL
