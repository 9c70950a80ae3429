"""A phone's answer is untrusted (docs/security.md "Untrusted answers"): each test here
makes a scripted phone lie or misbehave the way a stranger's phone could, and checks that
the gateway's bounds hold — learned rates stay finite and near what the gateway's own
clock saw, the watchdog keeps working, the usage charged to a key is clamped, oversized or
over-nested answers are cut and charged to the phone, and a stream whose continuation is
answered with a plain error ends with an error event instead of hanging. Each test also
checks the honest path beside it, so it could fail."""

import hashlib
import json
import math
import threading
import time

import pytest
import requests

import fleet
import gwutil as g
from fleet import T
from gwutil import MODEL, ScriptedPhone, chunk, completion
from test_admin import start as start_admin

KEY = "sk-attack-test-key"


@pytest.fixture
def scripted():
    phones = []

    def start(answer, id):
        p = ScriptedPhone(answer, id=id)
        phones.append(p)
        return p

    yield start
    for p in phones:
        p.close()


def rep(p, slots=1, prefill_tps=5000, decode_tps=500, **over):
    r = {"id": p.id, "url": p.url, "models": [MODEL], "slots": slots,
         "prefill_tps": prefill_tps, "decode_tps": decode_tps}
    r.update(over)
    return r


def body(**kw):
    b = fleet.chat_body("Hello there", model=MODEL, max_tokens=8)
    b.update(kw)
    return b


def post(d, b, stream=False, timeout=None, headers=None):
    return d.post(g.CHAT, json=b, stream=stream, timeout=timeout or T(20), headers=headers)


def with_timings(ans, timings):
    """A whole completion (dict) with llama-server's timings; raw JSON text when the
    timings hold literals json cannot write (1e999)."""
    if isinstance(timings, str):
        return json.dumps(ans)[:-1] + ', "timings": ' + timings + "}"
    return dict(ans, timings=timings)


def ok(r, want_replica=None):
    """A 200 chat completion (scripted phones write no system_fingerprint). Returns it."""
    assert r.status_code == 200, (r.status_code, r.text[:500])
    b = r.json()
    assert b["object"] == "chat.completion" and b["choices"][0]["message"]["role"] == "assistant", b
    if want_replica is not None:
        assert r.headers["x-fleetgate-replica"] == want_replica, r.headers
    return b


# The most prompt tokens charged for body()'s prompt: the larger of 4 x the gateway's
# estimate (its ChatML rendering, ~16 tokens) and the body's bytes, + 256.
PROMPT_MAX = max(4 * 16, 200) + 256


def failures(adm, rid):
    return adm.replicas()[rid]["failures"]


def finite_numbers(obj):
    """Every number in a JSON document (bools aside)."""
    if isinstance(obj, dict):
        for v in obj.values():
            yield from finite_numbers(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from finite_numbers(v)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield obj


def check_status_finite(adm):
    """The admin API's replicas and /metrics hold no NaN or infinity."""
    r = adm.get("/admin/v1/replicas")
    assert r.status_code == 200
    doc = json.loads(r.text, parse_constant=lambda c: pytest.fail(f"{c} in the replicas JSON"))
    assert all(math.isfinite(v) for v in finite_numbers(doc)), doc
    for rid, x in ((x["id"], x) for x in doc["replicas"]):
        assert isinstance(x["prefill_tps"], (int, float)) and x["prefill_tps"] > 0, (rid, x)
        assert isinstance(x["decode_tps"], (int, float)) and x["decode_tps"] > 0, (rid, x)
    text = adm.metrics_text().lower()
    for line in text.splitlines():
        if not line.startswith("#"):
            assert not line.endswith((" nan", " inf", " +inf", " -inf")), line


# ---------------------------------------------------------------------------- learned rates

def test_infinite_timings_do_not_win_every_plan(scripted, gateway):
    # the liar is slower than the honest phone but claims to be infinitely fast
    lie = {"prompt_n": 1e308, "prompt_ms": 1e-300, "predicted_n": 1e308, "predicted_ms": 1e-300}
    honest_t = {"prompt_n": 10, "prompt_ms": 4, "predicted_n": 2, "predicted_ms": 10}
    liar = scripted(lambda b, n: (200, with_timings(completion("lie"), lie), 0.15), "liar")
    honest = scripted(lambda b, n: (200, with_timings(completion("ok"), honest_t), 0.02), "honest")
    d, adm = start_admin(gateway, [rep(liar), rep(honest)], health={"interval_s": 0})
    served = []
    for _ in range(16):
        r = post(d, body())
        ok(r)
        served.append(r.headers["x-fleetgate-replica"])
    # without bounds the liar's rates become infinite after its first answer and it wins
    # every plan from then on; bounded by the gateway's clock it is seen as the slower
    assert served.count("liar") <= 4, served
    assert served.count("honest") >= 12, served
    check_status_finite(adm)
    reps = adm.replicas()
    assert reps["liar"]["decode_tps"] < 1e6 and reps["liar"]["prefill_tps"] < 1e6, reps["liar"]


def warm(d, phone, n):
    """n good answers from phone (the only one configured): a record of its own."""
    for _ in range(n):
        ok(post(d, body()), phone.id)


def add_replicas(d, adm, reps):
    """Add reps to d's config and reload: phones joining a fleet that has records."""
    from test_admin import rewrite_config  # noqa: PLC0415
    rewrite_config(d, lambda cfg: cfg["replicas"].extend(reps))
    assert adm.post("/admin/v1/reload").status_code == 200
    deadline = time.monotonic() + T(5)
    while time.monotonic() < deadline:
        states = adm.replicas()
        if all(states.get(r["id"], {}).get("state") == "ready" for r in reps):
            return
        time.sleep(0.05)
    pytest.fail(f"the added replicas are not ready: {adm.replicas()}")


def test_a_phone_without_a_record_takes_a_bounded_share(scripted, gateway):
    # a phone claiming 8 slots and huge speed, beside two honest one-slot phones with a
    # record: while it has none it holds at most the trusted phones' slots (or what it
    # earned with good answers)
    inflight = {"now": 0, "max": 0}
    lock = threading.Lock()
    delay = {"s": 0.0}

    def liar_answer(b, n):
        with lock:
            inflight["now"] += 1
            inflight["max"] = max(inflight["max"], inflight["now"])
        time.sleep(0.5)
        with lock:
            inflight["now"] -= 1
        return (200, completion("lie"))

    liar = scripted(liar_answer, "liar")
    a = scripted(lambda b, n: (200, completion("a"), delay["s"]), "a")
    b = scripted(lambda b, n: (200, completion("b"), delay["s"]), "b")
    d, adm = start_admin(gateway, [rep(a), rep(b)],
                         health={"interval_s": 0}, scheduler={"trust_after_answers": 8})
    delay["s"] = 0.1  # two at a time: both phones answer and earn a record
    for _ in range(20):
        if a.n >= 8 and b.n >= 8:
            break
        ts = [threading.Thread(target=lambda: ok(post(d, body()))) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert a.n >= 8 and b.n >= 8, (a.n, b.n)
    add_replicas(d, adm, [rep(liar, slots=8, prefill_tps=1e6, decode_tps=1e6)])
    delay["s"] = 0.5
    a0, b0 = a.n, b.n
    results = []

    def one():
        results.append(post(d, body(), timeout=T(30)))

    threads = [threading.Thread(target=one) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.status_code == 200 for r in results), [r.text for r in results if r.status_code != 200]
    # at most the two others' slots, then 1 + its good answers
    assert inflight["max"] <= 4, inflight
    assert a.n > a0 and b.n > b0, (a.n, b.n)


def test_several_ids_without_a_record_share_one_bounded_share(scripted, gateway):
    # three ids of one owner, 8 slots each, beside one honest 2-slot phone with a record:
    # together they hold no more than the trusted phone's slots (or what they earned)
    inflight = {"now": 0, "max": 0}
    lock = threading.Lock()

    def sybil_answer(b, n):
        with lock:
            inflight["now"] += 1
            inflight["max"] = max(inflight["max"], inflight["now"])
        time.sleep(0.5)
        with lock:
            inflight["now"] -= 1
        return (200, completion("sybil"))

    delay = {"s": 0.0}
    honest = scripted(lambda b, n: (200, completion("ok"), delay["s"]), "honest")
    sybils = [scripted(sybil_answer, f"sybil{i}") for i in range(3)]
    # answer checks off: this is the callers' share alone (a check's shadow requests are
    # pinned to the phone checked and to a witness, the honest phone here: they would
    # count in both phones' requests; test_verify.py has the checks)
    d, adm = start_admin(gateway, [rep(honest, slots=2)],
                         health={"interval_s": 0}, scheduler={"trust_after_answers": 8},
                         verify={"enabled": False})
    warm(d, honest, 8)
    add_replicas(d, adm, [rep(p, slots=8, prefill_tps=1e6, decode_tps=1e6) for p in sybils])
    delay["s"] = 0.5
    results = []

    def one():
        results.append(post(d, body(), timeout=T(30)))

    threads = [threading.Thread(target=one) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.status_code == 200 for r in results), [r.text for r in results if r.status_code != 200]
    served = [r.headers["x-fleetgate-replica"] for r in results]
    # unbounded, the 24 slots claimed take all 20 at once; as a group they start with the
    # honest phone's 2 and earn one more with each good answer
    assert inflight["max"] <= 8, (inflight, served)
    assert served.count("honest") >= 4, served


def test_a_rogue_that_refuses_everything_is_contradicted_and_charged(scripted, gateway):
    # a phone claiming huge speed and 64 slots answers every request at once with a
    # readable 400: without a record its refusals are asked of another phone, which
    # answers; the rogue is charged for each and ejected
    refusal = {"error": {"code": 400, "message": "no", "type": "invalid_request_error"}}
    rogue = scripted(lambda b, n: (400, refusal), "rogue")
    honest_t = {"prompt_n": 20, "prompt_ms": 10, "predicted_n": 4, "predicted_ms": 20}
    honest = scripted(lambda b, n: (200, with_timings(completion("ok"), honest_t), 0.02), "honest")
    d, adm = start_admin(gateway, [rep(rogue, slots=64, prefill_tps=1e7, decode_tps=1e7),
                                   rep(honest, slots=2)],
                         health={"interval_s": 0}, scheduler={"trust_after_answers": 8})
    served = []
    for _ in range(12):
        r = post(d, body())
        ok(r, "honest")
        served.append(r.headers["x-fleetgate-replica"])
    assert rogue.n >= 1, rogue.n
    assert rogue.n <= 4, rogue.n  # ejected after its refusals were contradicted
    reps = adm.replicas()
    assert reps["rogue"]["state"] != "ready" or reps["rogue"]["failures"] >= 1, reps["rogue"]
    # (rates a phone claims in heartbeats are bounded by the fleet's learned ones:
    # tests/unit/test_bounds.c; these are the operator's config seeds)
    # the honest way through: a refusal the second phone confirms stays the request's
    honest2 = scripted(lambda b, n: (400, refusal), "honest2")
    fresh = scripted(lambda b, n: (400, refusal), "fresh")
    d2, adm2 = start_admin(gateway, [rep(fresh), rep(honest2)], health={"interval_s": 0})
    r = post(d2, body())
    assert r.status_code == 400, r.text
    assert fresh.n + honest2.n == 2, (fresh.n, honest2.n)
    reps = adm2.replicas()
    assert reps["fresh"]["failures"] == 0 and reps["honest2"]["failures"] == 0, reps


def test_a_replica_url_leading_back_to_the_gateway_does_not_loop(scripted, gateway):
    honest = scripted(lambda b, n: (200, completion("ok")), "honest")

    def cfg(ports):
        self_rep = {"id": "self", "url": f"http://127.0.0.1:{ports[0]}", "models": [MODEL],
                    "slots": 4, "prefill_tps": 1e6, "decode_tps": 1e6}
        from test_admin import admin_config  # noqa: PLC0415
        return admin_config(ports, [self_rep, rep(honest)], health={"interval_s": 0})

    from test_admin import TOKEN, TOKEN_ENV, Admin  # noqa: PLC0415
    d = gateway(cfg, n_ports=2, env={TOKEN_ENV: TOKEN})
    adm = Admin(d)
    time.sleep(0.3)
    t0 = time.monotonic()
    for _ in range(5):
        ok(post(d, body(), timeout=T(10)), "honest")
    assert time.monotonic() - t0 < T(5)
    # a caller's request that carries the hop header is refused at once
    r = post(d, body(), headers={"x-fleetgate-hop": "elsewhere"})
    assert r.status_code == 508, r.text
    assert r.json()["error"]["code"] == "loop_detected", r.text
    assert honest.n == 5, honest.n
    reps = adm.replicas()
    assert reps["self"]["state"] != "ready" or reps["self"]["failures"] >= 1, reps["self"]


# ---------------------------------------------------------------------------- the watchdog

def test_nan_timings_leave_the_watchdog_working(scripted, gateway):
    nan = '{"prompt_n": 1e999, "prompt_ms": 1e999, "predicted_n": 1e999, "predicted_ms": 1e999}'

    def answer(b, n):
        if n == 1:
            return (200, with_timings(completion("first"), nan))
        return (200, completion("too late"), 30)  # then it hangs

    p = scripted(answer, "nan")
    d, adm = start_admin(gateway, [rep(p)], health={"interval_s": 0}, scheduler={"retries": 0},
                         upstream={"timeout_margin": 1, "timeout_min_s": 1})
    ok(post(d, body()))  # the honest-looking first answer is served
    check_status_finite(adm)
    t0 = time.monotonic()
    r = post(d, body(), timeout=T(25))
    took = time.monotonic() - t0
    assert r.status_code in (502, 504), (r.status_code, r.text[:300])
    assert took < T(8), took  # cut at the watchdog, not after the phone's 30 s
    assert failures(adm, "nan") >= 1


# ---------------------------------------------------------------------------- usage

def test_inflated_usage_does_not_lock_a_key_out(scripted, gateway):
    def answer(b, n):
        c = completion("ok", tokens=2)
        c["usage"] = {"prompt_tokens": 1e15, "completion_tokens": 1e15, "total_tokens": 2e15}
        return (200, c)

    p = scripted(answer, "inflator")
    keys = [{"name": "team", "key_sha256": hashlib.sha256(KEY.encode()).hexdigest(), "tpm": 5000}]
    d, adm = start_admin(gateway, [rep(p)], health={"interval_s": 0}, api_keys=keys)
    h = {"Authorization": f"Bearer {KEY}"}
    r = post(d, body(), headers=h)
    u = ok(r)["usage"]
    # shown as charged: at most what the request can hold, and the request's cap
    assert u["prompt_tokens"] <= PROMPT_MAX, u
    assert u["completion_tokens"] <= 8, u
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u
    rec = g.access_log(d, r.headers["x-request-id"])
    assert rec["tokens_in"] == u["prompt_tokens"] and rec["tokens_out"] == u["completion_tokens"], rec
    # the key still has its budget: the next requests get through
    for _ in range(3):
        ok(post(d, body(), headers=h))
    assert adm.metrics().get("fleetgate_usage_clamped_total", 0) >= 4
    assert g.log_msgs(d, "usage clamped: the replica reported more than the gateway believes")
    # the budget still binds: a long prompt's (clamped) usage passes the minute's tpm, and
    # the next request is refused until the minute is over
    r = post(d, body(max_tokens=8, messages=[{"role": "user", "content": "x" * 40000}]), headers=h)
    assert r.status_code == 200, (r.status_code, r.text[:200])
    r = post(d, body(), headers=h)
    assert r.status_code == 429, (r.status_code, r.text[:200])


def test_usage_that_is_no_number_is_replaced_where_the_caller_sees_it(scripted, gateway):
    raw = json.dumps(completion("ok", tokens=2)).replace('"prompt_tokens": 5', '"prompt_tokens": 1e999') \
        .replace('"completion_tokens": 2', '"completion_tokens": -7')
    assert "1e999" in raw and "-7" in raw
    p = scripted(lambda b, n: (200, raw), "nonumber")
    d, adm = start_admin(gateway, [rep(p)], health={"interval_s": 0})
    r = post(d, body())
    u = json.loads(ok(r) and r.text, parse_constant=lambda c: pytest.fail(f"{c} in the usage"))["usage"]
    assert 1 <= u["prompt_tokens"] <= PROMPT_MAX and 0 <= u["completion_tokens"] <= 8, u
    rec = g.access_log(d, r.headers["x-request-id"])
    assert rec["tokens_in"] == u["prompt_tokens"], rec
    assert adm.metrics().get("fleetgate_usage_clamped_total", 0) == 1


def test_inflated_usage_in_a_stream_is_clamped_where_the_caller_sees_it(scripted, gateway):
    fat = chunk({}, finish="stop")
    fat["usage"] = {"prompt_tokens": 1e15, "completion_tokens": 1e15, "total_tokens": 2e15}
    p = scripted(lambda b, n: ("stream", [chunk({"role": "assistant", "content": None}),
                                          chunk({"content": "hi"}), fat, "[DONE]"]), "inflator")
    d, adm = start_admin(gateway, [rep(p)], health={"interval_s": 0})
    r = post(d, body(stream=True, stream_options={"include_usage": True}), stream=True)
    assert r.status_code == 200
    res = fleet.read_sse(r, timeout=T(10))
    assert res.done, res.data
    usage = [c["usage"] for c in res.chunks() if c.get("usage")]
    assert usage and usage[-1]["prompt_tokens"] <= PROMPT_MAX and usage[-1]["completion_tokens"] <= 8, usage
    rec = g.access_log(d, r.headers["x-request-id"])
    assert rec["tokens_in"] <= PROMPT_MAX and rec["tokens_out"] <= 8, rec


def test_claimed_completion_tokens_are_bounded_by_what_was_relayed(scripted, gateway):
    """A phone claims the whole cap (250 tokens) for a few words. The caller is charged
    what it was given, one token a byte of text and a chunk + 16 (docs/security.md,
    "Untrusted answers") -- in the usage it is shown, the access log and its key's tpm
    budget, for whole answers and streams -- while an honest phone's usage beside it is
    charged as it says."""
    def prompt_of(b):
        return b["messages"][-1]["content"]

    def answer(b, n):
        if b.get("stream"):
            fat = chunk({}, finish="stop")
            fat["usage"] = {"prompt_tokens": 5, "completion_tokens": 250, "total_tokens": 255}
            return ("stream", [chunk({"role": "assistant", "content": None}), chunk({"content": "ok"}),
                               chunk({"content": " go"}), chunk({"content": "!"}), fat, "[DONE]"])
        if "honest" in prompt_of(b):
            return (200, completion("an honest answer here", tokens=4))
        return (200, completion("ok go", tokens=250))

    p = scripted(answer, "claimer")
    keys = [{"name": "team", "key_sha256": hashlib.sha256(KEY.encode()).hexdigest(), "tpm": 300}]
    d, adm = start_admin(gateway, [rep(p)], health={"interval_s": 0}, api_keys=keys)
    h = {"Authorization": f"Bearer {KEY}"}
    whole_max = len("ok go") + 1 + 16
    # without the bound each answer costs 5 + 250 of the key's 300 a minute: the third is
    # refused; bounded, six go through
    for i in range(6):
        r = post(d, body(max_tokens=250, messages=[{"role": "user", "content": f"lie {i}"}]), headers=h)
        u = ok(r)["usage"]
        assert u["completion_tokens"] == whole_max and u["prompt_tokens"] == 5, u
        assert u["total_tokens"] == 5 + whole_max, u
        rec = g.access_log(d, r.headers["x-request-id"])
        assert rec["tokens_out"] == whole_max and rec["tokens_in"] == 5, rec
    r = post(d, body(max_tokens=250, stream=True, stream_options={"include_usage": True}), stream=True, headers=h)
    assert r.status_code == 200, r.text
    res = fleet.read_sse(r, timeout=T(10))
    assert res.done, res.data
    stream_max = len("ok go!") + 5 + 16  # the text, five chunks with a choice (role, three words, finish)
    usage = [c["usage"] for c in res.chunks() if c.get("usage")]
    assert usage and usage[-1]["completion_tokens"] == stream_max, usage
    rec = g.access_log(d, r.headers["x-request-id"])
    assert rec["tokens_out"] == stream_max, rec
    assert adm.metrics().get("fleetgate_usage_clamped_total", 0) == 7
    assert g.log_msgs(d, "usage clamped: the replica reported more than the gateway believes")
    # the honest answer's usage stands as it was reported
    r = post(d, body(max_tokens=250, messages=[{"role": "user", "content": "honest please"}]), headers=h)
    assert ok(r)["usage"]["completion_tokens"] == 4
    assert g.access_log(d, r.headers["x-request-id"])["tokens_out"] == 4
    assert adm.metrics().get("fleetgate_usage_clamped_total", 0) == 7


# ---------------------------------------------------------------------------- sizes and shapes

def whole_and_honest(scripted, gateway, bad_answer):
    """A liar that looks fastest answers bad_answer; an honest phone answers after it."""
    liar = scripted(lambda b, n: bad_answer(b, n), "liar")
    honest = scripted(lambda b, n: (200, completion("fine")), "honest")
    d, adm = start_admin(gateway, [rep(liar, prefill_tps=50000, decode_tps=5000), rep(honest)],
                         health={"interval_s": 0})
    return liar, honest, d, adm


def test_a_huge_whole_answer_is_cut_and_charged_to_the_phone(scripted, gateway):
    huge = json.dumps(completion("x" * (30 << 20)))
    liar, honest, d, adm = whole_and_honest(scripted, gateway, lambda b, n: (200, huge))
    t0 = time.monotonic()
    r = post(d, body())
    ok(r, want_replica="honest")  # retried elsewhere: the caller is served
    assert time.monotonic() - t0 < T(10)
    assert liar.n == 1 and failures(adm, "liar") == 1
    fail = g.log_msgs(d, "attempt failed", replica="liar")
    assert fail and "the answer passed" in fail[0]["detail"], fail


def test_an_endless_stream_is_cut_and_charged_to_the_phone(scripted, gateway):
    def endless(b, n):
        if n > 1:  # then it answers as it should
            return ("stream", [chunk({"role": "assistant", "content": None})] +
                    [chunk({"content": "y"}) for _ in range(8)] + [chunk({}, finish="length"), "[DONE]"])

        def events():
            yield chunk({"role": "assistant", "content": None})
            while True:
                yield chunk({"content": "x"})
        return ("stream", events())

    liar = scripted(endless, "liar")
    d, adm = start_admin(gateway, [rep(liar)], health={"interval_s": 0})
    t0 = time.monotonic()
    r = post(d, body(stream=True), stream=True)
    assert r.status_code == 200
    res = fleet.read_sse(r, timeout=T(15))
    assert not res.timed_out and time.monotonic() - t0 < T(10)
    chunks = res.chunks()
    text = [c for c in chunks if c.get("choices") and c["choices"][0]["delta"].get("content")]
    assert 8 <= len(text) <= 8 + 16, len(text)
    assert chunks[-1].get("error", {}).get("code") == "upstream_stream_error", chunks[-1]
    assert failures(adm, "liar") == 1
    fail = g.log_msgs(d, "attempt failed", replica="liar")
    assert fail and "text chunks" in fail[0]["detail"], fail
    # a stream of max_tokens chunks is not cut
    r = post(d, body(stream=True), stream=True)
    res = fleet.read_sse(r, timeout=T(15))
    assert res.done, res.data[-3:]
    assert sum(1 for c in res.chunks() if c.get("choices") and c["choices"][0]["delta"].get("content")) == 8


def test_an_endless_stream_without_text_is_cut_and_goes_on_elsewhere(scripted, gateway):
    pad = "p" * 4000

    def endless(b, n):
        def events():
            yield chunk({"role": "assistant", "content": None})
            while True:
                yield dict(chunk({}), pad=pad)
        return ("stream", events())

    liar = scripted(endless, "liar")
    honest = scripted(lambda b, n: ("stream", [chunk({"role": "assistant", "content": None}),
                                               chunk({"content": "fine"}), chunk({}, finish="stop"),
                                               "[DONE]"]), "honest")
    d, adm = start_admin(gateway, [rep(liar, prefill_tps=50000, decode_tps=5000), rep(honest)],
                         health={"interval_s": 0})
    r = post(d, body(stream=True), stream=True)
    assert r.status_code == 200
    res = fleet.read_sse(r, timeout=T(15))
    assert res.done and not res.timed_out, res.data[-3:]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in res.chunks() if c.get("choices"))
    assert text == "fine", text
    assert failures(adm, "liar") == 1
    fail = g.log_msgs(d, "attempt failed", replica="liar")
    assert fail and "the stream passed" in fail[0]["detail"], fail


@pytest.mark.parametrize("shape", ["deep", "values"])
def test_an_over_nested_or_over_full_answer_is_a_phone_failure(scripted, gateway, shape):
    if shape == "deep":
        bad = json.dumps(completion("x"))[:-1] + ', "x": ' + "[" * 10000 + "]" * 10000 + "}"
        max_tokens = 8
    else:
        bad = json.dumps(completion("x"))[:-1] + ', "x": [' + "0," * 1000000 + "0]}"
        max_tokens = 2048  # so the size cap lets it through to the value cap
    liar, honest, d, adm = whole_and_honest(scripted, gateway, lambda b, n: (200, bad))
    r = post(d, body(max_tokens=max_tokens))
    ok(r, want_replica="honest")
    assert failures(adm, "liar") == 1
    fail = g.log_msgs(d, "attempt failed", replica="liar")
    assert fail and "not an acceptable JSON object" in fail[0]["detail"], fail


def test_an_over_nested_stream_event_is_a_phone_failure(scripted, gateway):
    deep = json.dumps(chunk({"content": "x"}))[:-1] + ', "x": ' + "[" * 10000 + "]" * 10000 + "}"
    liar = scripted(lambda b, n: ("stream", [chunk({"role": "assistant", "content": None}), deep,
                                             chunk({}, finish="stop"), "[DONE]"]), "liar")
    honest = scripted(lambda b, n: ("stream", [chunk({"role": "assistant", "content": None}),
                                               chunk({"content": "fine"}), chunk({}, finish="stop"),
                                               "[DONE]"]), "honest")
    d, adm = start_admin(gateway, [rep(liar, prefill_tps=50000, decode_tps=5000), rep(honest)],
                         health={"interval_s": 0})
    r = post(d, body(stream=True), stream=True)
    res = fleet.read_sse(r, timeout=T(15))
    assert res.done, res.data[-3:]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in res.chunks() if c.get("choices"))
    assert text == "fine", text
    assert failures(adm, "liar") == 1
    fail = g.log_msgs(d, "attempt failed", replica="liar")
    assert fail and "not acceptable JSON" in fail[0]["detail"], fail


# ---------------------------------------------------------------------------- continuations

@pytest.mark.parametrize("answer", ["400", "500", "whole"])
def test_a_continuation_answered_without_a_stream_ends_the_stream(scripted, gateway, answer):
    breaker = scripted(lambda b, n: ("stream", [chunk({"role": "assistant", "content": None}),
                                                chunk({"content": "Hello"}), 0.05]), "breaker")
    err = {"error": {"code": 400, "message": "Assistant response prefill is incompatible",
                     "type": "invalid_request_error"}}
    plain = {"400": (400, err), "500": (500, {"error": {"code": 500, "message": "boom",
                                                        "type": "server_error"}}),
             "whole": (200, completion(" world"))}[answer]
    cont = scripted(lambda b, n: plain, "cont")
    d, adm = start_admin(gateway, [rep(breaker, prefill_tps=50000, decode_tps=5000), rep(cont)],
                         health={"interval_s": 0}, scheduler={"retries": 1})
    t0 = time.monotonic()
    r = post(d, body(stream=True), stream=True, timeout=T(15))
    assert r.status_code == 200
    res = fleet.read_sse(r, timeout=T(15))
    took = time.monotonic() - t0
    assert not res.timed_out and res.error is None, (res.error, res.data[-3:])
    assert took < T(8), took
    chunks = res.chunks()
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    assert text == "Hello", text
    assert "error" in chunks[-1], chunks[-1]  # an explicit error event, not a hang
    assert cont.n == 1
    if answer == "400":
        # a refusal of the continuation (the carried text, say) is not the phone's failure
        assert failures(adm, "cont") == 0
    # the honest way through: a continuation that streams finishes the answer
    good = scripted(lambda b, n: ("stream", [chunk({"role": "assistant", "content": None}),
                                             chunk({"content": " world"}), chunk({}, finish="stop"),
                                             "[DONE]"]), "good")
    d2, _ = start_admin(gateway, [rep(breaker, prefill_tps=50000, decode_tps=5000), rep(good)],
                        health={"interval_s": 0})
    r = post(d2, body(stream=True), stream=True, timeout=T(15))
    res = fleet.read_sse(r, timeout=T(15))
    assert res.done, res.data[-3:]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in res.chunks() if c.get("choices"))
    assert text == "Hello world", text


# ---------------------------------------------------------------------------- rates from Redis

def test_rates_from_redis_are_bounded(procs, scripted, gateway):
    """Rates another gateway (or anyone who holds the gateways' Redis key) shares are seeds
    like a phone's: "inf" and "nan" scan as numbers, and are ignored; absurd ones are
    clamped. The values are sealed (test_attack_redis.seal), so only the bounds decide."""
    from test_admin import TOKEN, TOKEN_ENV, Admin, admin_config  # noqa: PLC0415
    from test_attack_redis import KEY, seal  # noqa: PLC0415
    from test_redis import rcli, start_redis  # noqa: PLC0415
    fleet.need_tool("redis-server", "deploy/setup.sh --test installs it")
    rd = start_redis(procs)
    for pid, val in (("nan", b"nan inf"), ("huge", b"1e300 1e300"), ("fair", b"1234 56")):
        rcli(rd.redis_port, "HSET", "fleetgate:rates", pid,
             seal(f"fleetgate:rates {pid}", val, sender="gw9").decode())
    phones = [scripted(lambda b, n: (200, completion("ok")), pid) for pid in ("nan", "huge", "fair")]

    def config(ports):
        cfg = admin_config(ports, [rep(p) for p in phones], health={"interval_s": 0})
        cfg["redis"] = {"url": f"redis://127.0.0.1:{rd.redis_port}/0", "gateway_id": "gw0",
                        "timeout_s": 0.5, "lease_ttl_s": 3, "key_env": "FG_REDIS_KEY"}
        return cfg

    d = gateway(config, n_ports=2, env={TOKEN_ENV: TOKEN, "FG_REDIS_KEY": KEY},
                ready=lambda d: (g.replicas_ready(d) or 0) >= 3)
    adm = Admin(d)
    assert fleet.wait_until(lambda: adm.replicas()["fair"]["prefill_tps"] == 1234, T(10)), adm.replicas()
    reps = adm.replicas()
    assert reps["fair"]["decode_tps"] == 56, reps["fair"]  # the honest seed is taken
    assert reps["nan"]["prefill_tps"] == 5000 and reps["nan"]["decode_tps"] == 500, reps["nan"]
    assert reps["huge"]["prefill_tps"] == 1e6 and reps["huge"]["decode_tps"] == 1e6, reps["huge"]
    check_status_finite(adm)
    ok(post(d, body()))
