"""The 2026 engine's errors judged as what they are (docs/routing.md "Phone failures and
request errors"), with sims answering as b10587 does (tests/system/fixtures has the real
engine's answers: context-*.http, unparsable-*.http; test_llama.py asks the real one):

- a prompt longer than a phone's context is b10587's 400 `exceed_context_size_error` with
  `n_prompt_tokens` and `n_ctx` (plain JSON, also when a stream was asked): a phone of a
  larger context takes it, planned on the engine's count; where none can, the caller gets
  OpenAI's `context_length_exceeded` with the numbers. The phone is never charged.
- an answer the engine cannot read back is a 500 after the whole generation (a whole
  answer), or an error event after the stream's tokens: a whole answer is written again on
  a second phone, and the same there is the request's fault (400 `model_output_unparsable`);
  a stream has sent every token by then and ends with that error event. Neither phone is
  charged."""

import fleet
import gwutil as g
from fleet import T, read_sse, wait_until
from gwutil import MODEL
from test_admin import start as start_admin

UNPARSABLE = [{"at_s": 0, "kind": "unparsable", "dur_s": 3600}]
# a refusal comes at once; what comes after this long took the phone work (a generation of
# the sim's few tokens stands for a phone's minutes here)
LATE = {"refusal_window_s": 0.01}


def chat(n_words=8, stream=False, max_tokens=6):
    text = " ".join(f"word{i}" for i in range(n_words))
    return fleet.chat_body(text, model=MODEL, max_tokens=max_tokens, stream=stream,
                           include_usage=True if stream else None)


def requests_of(d):
    r = d.get("/agent/v1/status")
    assert r.status_code == 200, r.text
    return r.json()["requests"]


def charged(adm):
    return {k: (x["state"], x["failures"]) for k, x in adm.replicas().items()}


def test_a_prompt_past_a_phones_context_goes_to_one_that_holds_it(sim, gateway):
    # "small" says 512 tokens a slot; the operator's file says 8192 (a phone whose engine
    # was started with a smaller context than its entry claims): the gateway learns it from
    # the engine's refusal
    small = g.phone(sim, "small", slots=1, n_ctx=512)
    big = g.phone(sim, "big", slots=1, n_ctx=8192)
    d, adm = start_admin(gateway, [g.replica(small, n_ctx=8192, prefill_tps=1e6),
                                   g.replica(big, prefill_tps=10)])
    for stream in (False, True):
        r = d.post(g.CHAT, json=chat(1200, stream=stream), stream=stream, timeout=T(30))
        assert r.status_code == 200, r.text
        assert r.headers["x-fleetgate-replica"] == "big", r.headers
        if stream:
            assert read_sse(r, timeout=T(30)).done
    assert requests_of(small) >= 1
    assert charged(adm) == {"small": ("ready", 0), "big": ("ready", 0)}, adm.replicas()


def test_a_prompt_past_every_context_is_context_length_exceeded(sim, gateway):
    small = g.phone(sim, "small", slots=1, n_ctx=512)
    d, adm = start_admin(gateway, [g.replica(small, n_ctx=8192)])
    for stream in (False, True):
        r = d.post(g.CHAT, json=chat(1200, stream=stream), stream=stream, timeout=T(30))
        e = g.check_error(r, 400, code="context_length_exceeded")
        assert e["param"] == "messages", e
        assert e["type"] == "invalid_request_error", e
        # OpenAI's words, the engine's numbers
        assert e["message"].startswith("This model's maximum context length is 512 tokens. "
                                       "However, your messages resulted in "), e
        n = int(e["message"].split("resulted in ")[1].split(" ")[0])
        assert n > 1200, e
    assert charged(adm) == {"small": ("ready", 0)}, adm.replicas()
    m = adm.metrics()
    assert m['fleetgate_request_refusals_total{source="replica",code="context_length_exceeded"}'] == 2, m


def test_an_unreadable_answer_is_written_again_on_another_phone(sim, gateway):
    bad = g.phone(sim, "bad", slots=1, fault_plan=UNPARSABLE)
    good = g.phone(sim, "good", slots=1)
    d, adm = start_admin(gateway, [g.replica(bad, prefill_tps=1e6, decode_tps=1e5), g.replica(good)],
                         upstream=LATE)
    # the gateway's feature probes (requests too) are done before the phone's count is read
    assert wait_until(lambda: g.log_msgs(d, "replica's engine features", replica="bad"), T(10))
    n0 = requests_of(bad)
    r = d.post(g.CHAT, json=chat(), timeout=T(30))
    assert r.status_code == 200, r.text
    assert r.headers["x-fleetgate-replica"] == "good", r.headers
    assert requests_of(bad) == n0 + 1
    # streamed: the engine reads the answer back once it has sent every token, so there is
    # nothing left to write elsewhere: the stream ends with the error event, in our code
    r = d.post(g.CHAT, json=chat(stream=True, max_tokens=12), stream=True, timeout=T(30))
    assert r.status_code == 200, r.text
    assert r.headers["x-fleetgate-replica"] == "bad", r.headers
    res = read_sse(r, timeout=T(30))
    assert not res.done, res.data
    assert res.chunks()[-1]["error"]["code"] == "model_output_unparsable", res.data[-1]
    assert requests_of(bad) == n0 + 2
    assert charged(adm) == {"bad": ("ready", 0), "good": ("ready", 0)}, adm.replicas()


def test_an_answer_unreadable_on_two_phones_is_the_requests_fault(sim, gateway):
    a = g.phone(sim, "a", slots=1, fault_plan=UNPARSABLE)
    b = g.phone(sim, "b", slots=1, fault_plan=UNPARSABLE)
    d, adm = start_admin(gateway, [g.replica(a), g.replica(b)], upstream=LATE)
    assert wait_until(lambda: all(g.log_msgs(d, "replica's engine features", replica=x) for x in "ab"), T(10))
    a0, b0 = requests_of(a), requests_of(b)
    r = d.post(g.CHAT, json=chat(), timeout=T(30))
    e = g.check_error(r, 400, code="model_output_unparsable")
    assert "does not match the expected" in e["message"], e
    assert requests_of(a) == a0 + 1 and requests_of(b) == b0 + 1
    assert wait_until(lambda: charged(adm) == {"a": ("ready", 0), "b": ("ready", 0)}, T(3)), adm.replicas()
    m = adm.metrics()
    assert m['fleetgate_request_refusals_total{source="replica",code="model_output_unparsable"}'] == 1, m
