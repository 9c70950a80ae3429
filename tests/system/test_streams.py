"""Streams that lose their phone mid-answer go on on another phone: the client sees one
unbroken answer (one id, no second role chunk, no error event, [DONE], usage counting
every token), and only when no phone can take over does the stream end with an error
event."""
import json
import threading
from pathlib import Path

import pytest
import requests

import fleet
import gwutil as g
from fleet import T

DROP_ALWAYS = [{"at_s": 0, "kind": "drop", "dur_s": 100000}]


def stream(gw, max_tokens=40, include_usage=True, **extra):
    body = fleet.chat_body("tell me a long story", model=g.MODEL, max_tokens=max_tokens,
                           stream=True, **extra)
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    r = requests.post(gw.url + "/v1/chat/completions", json=body, stream=True, timeout=T(60))
    assert r.status_code == 200, r.text
    return r, fleet.read_sse(r, timeout=T(60))


def unbroken(r, res, first):
    """The chunks of a stream that started on phone first and ended whole: no read error,
    [DONE], no error event."""
    assert r.headers["x-fleetgate-replica"] == first, r.headers
    assert not res.timed_out and res.error is None, res.error
    assert res.done, f"no [DONE]: {res.data[-3:]}"
    chunks = res.chunks()
    assert not any("error" in c for c in chunks), [c for c in chunks if "error" in c]
    return chunks


def test_stream_continues_on_another_phone(sim, gateway):
    # the dropper looks much faster, so the stream starts there; it cuts every stream
    # after a few tokens
    dropper = g.phone(sim, "dropper", slots=1, decode_tps=20, fault_plan=DROP_ALWAYS)
    steady = g.phone(sim, "steady", slots=1, decode_tps=20)
    gw = g.start_gateway(gateway, [g.replica(dropper, decode_tps=2000), g.replica(steady)],
                         health={"interval_s": 0})
    r, res = stream(gw, max_tokens=40)
    chunks = unbroken(r, res, "dropper")
    # one answer: one id, one role chunk, one finish, usage over all of it
    assert len({c["id"] for c in chunks}) == 1, {c["id"] for c in chunks}
    roles = [c for c in chunks if c["choices"] and "role" in c["choices"][0]["delta"]]
    assert len(roles) == 1
    finishes = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finishes) == 1 and finishes[0]["choices"][0]["finish_reason"] == "length"
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(content) == 40, len(content)
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == 40, usage
    # both phones wrote part of it
    fps = {c.get("system_fingerprint") for c in content}
    assert fps == {"dropper", "steady"}, fps
    rec = g.access_log(gw, r.headers["x-request-id"])
    assert rec["status"] == 200 and rec["stream_continued"] >= 1 and rec["tokens_out"] == 40, rec
    fail = g.log_msgs(gw, "attempt failed", replica="dropper")
    assert fail and fail[0]["stream_started"] is True


def test_stream_ends_with_error_event_when_no_phone_can_continue(sim, gateway):
    dropper = g.phone(sim, "dropper", slots=1, decode_tps=20, fault_plan=DROP_ALWAYS)
    gw = g.start_gateway(gateway, [g.replica(dropper)], health={"interval_s": 0})
    r, res = stream(gw, max_tokens=40)
    assert not res.timed_out
    assert not res.done
    err = res.chunks()[-1]
    assert set(err["error"]) == {"message", "type", "param", "code"}, err
    assert err["error"]["code"] == "upstream_stream_error"


def test_a_thinking_stream_continues_with_its_reasoning(sim, gateway):
    """A thinking model's answer (all reasoning_content, as b10587's Qwen3.5 writes it)
    broken off goes on on a phone whose engine continues a final assistant message: the
    reasoning so far is carried (reasoning_content, continue_final_message) and the new
    phone's tokens are reasoning too; one answer as for content."""
    dropper = g.phone(sim, "dropper", slots=1, decode_tps=20, fault_plan=DROP_ALWAYS, extra_args=["--thinking"])
    steady = g.phone(sim, "steady", slots=1, decode_tps=20, extra_args=["--thinking"])
    gw = g.start_gateway(gateway, [g.replica(dropper, decode_tps=2000), g.replica(steady)],
                         health={"interval_s": 0.3})  # (ready: its status, features included, was read)
    r, res = stream(gw, max_tokens=40)
    assert r.headers["x-fleetgate-replica"] == "dropper"
    assert res.done and res.error is None, (res.error, res.data[-3:])
    chunks = res.chunks()
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    reasoning = [d for d in deltas if d.get("reasoning_content")]
    assert len(reasoning) == 40 and not [d for d in deltas if d.get("content")], deltas[:5]
    assert {c["system_fingerprint"] for c in chunks if c["choices"] and c["choices"][0]["delta"].get("reasoning_content")} \
        == {"dropper", "steady"}
    assert len({c["id"] for c in chunks}) == 1 and sum("role" in d for d in deltas) == 1
    assert chunks[-1]["usage"]["completion_tokens"] == 40, chunks[-1]
    rec = g.access_log(gw, r.headers["x-request-id"])
    assert rec["status"] == 200 and rec["stream_continued"] >= 1 and rec["tokens_out"] == 40, rec


def test_a_thinking_stream_ends_where_only_an_older_engine_is_left(sim, gateway):
    """The same with only a phone of the 2025 release to go on (--sim-release 2025: no
    continue_final_message, so no way to carry reasoning): the stream ends with the error
    event and that phone is never asked; a content answer broken off in the same fleet goes
    on there, as before."""
    dropper = g.phone(sim, "dropper", slots=1, decode_tps=20, fault_plan=DROP_ALWAYS, extra_args=["--thinking"])
    old = g.phone(sim, "old", slots=1, decode_tps=20, extra_args=["--sim-release", "2025"])
    gw = g.start_gateway(gateway, [g.replica(dropper, decode_tps=2000), g.replica(old)], health={"interval_s": 0.3})
    r, res = stream(gw, max_tokens=40)
    assert not res.done and res.chunks()[-1]["error"]["code"] == "upstream_stream_error", res.data[-3:]
    rec = g.access_log(gw, r.headers["x-request-id"])
    assert rec["attempts"] == 1 and rec["outcome"] == "stream_error", rec
    assert not g.log_msgs(gw, "request", replica="old")
    r, res = stream(gw, max_tokens=40, chat_template_kwargs={"enable_thinking": False})
    assert res.done and not [c for c in res.chunks() if "error" in c], res.data[-3:]
    assert g.access_log(gw, r.headers["x-request-id"])["replica"] == "old"


@pytest.mark.skipif(fleet.under_valgrind(), reason="valgrind holds descriptors of its own")
def test_more_clients_than_descriptors_wait_instead_of_failing(sim, gateway):
    """Every held request costs the gateway two descriptors (client and phone). Under a low
    open-files limit the gateway accepts only as many clients as it has descriptors for
    (both sides, plus a reserve); the others wait in the listen queue and are served as
    running requests end: all answered, none failed, no phone blamed."""
    phones = [g.phone(sim, f"fd{i}", slots=32, decode_tps=20) for i in range(2)]
    limit = 90  # budget: (90 - 32 - 4 idle phone connections) / 2 = 27 clients
    gw = gateway(lambda ports: g.gw_config(ports[0], [g.replica(p) for p in phones],
                                           queue={"max": 200, "timeout_s": 60}),
                 ready=lambda d: (g.replicas_ready(d) or 0) >= 2,
                 prefix=("prlimit", f"--nofile={limit}:{limit}"))
    n = 45
    results = [None] * n
    go = threading.Barrier(n)

    def one(i):
        # ~1 s per stream (the phones decode 200 tok/s in wall time): all are open at once
        body = fleet.chat_body(f"story number {i}", model=g.MODEL, max_tokens=200, stream=True)
        go.wait(T(30))
        try:
            r = requests.post(gw.url + "/v1/chat/completions", json=body, stream=True, timeout=T(60))
            res = fleet.read_sse(r, timeout=T(60)) if r.status_code == 200 else None
            results[i] = (r.status_code, bool(res and res.done and res.error is None))
        except requests.RequestException as e:
            results[i] = (type(e).__name__, False)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(T(90))
    bad = [(i, r) for i, r in enumerate(results) if r != (200, True)]
    assert not bad, (bad[:5], len(bad), gw.logs())
    assert "connection limit reached" in Path(gw.stderr_path).read_text(), \
        "the clients never exceeded the budget: the test proves nothing"
    assert g.replicas_ready(gw) == 2, gw.logs()
    assert not g.log_msgs(gw, "attempt failed"), "an attempt failed"


def test_a_stream_continues_on_a_free_phone_rather_than_go_silent_past_its_limit(sim, gateway):
    """A stream cut mid-way waits in silence for a phone to take it over, at most
    upstream.stream_idle_timeout_s. The phone that would finish its rest soonest is busy
    for longer than that: the rest goes to a slower phone that is free now, and the client
    gets its whole answer (before: it waited for the busy phone, past its limit, and got an
    error event: B7's fast2slow20 fleet in churn)."""
    limit = T(1.0)
    # the dropper looks fastest, so the stream starts there (10 tokens a second: ~10 s for
    # its 100); quick is next; slow the slowest. The long answer fits only on quick
    dropper = g.phone(sim, "dropper", slots=1, decode_tps=1, n_ctx=400, check_exit=False)
    quick = g.phone(sim, "quick", slots=1, decode_tps=20, n_ctx=16384)
    slow = g.phone(sim, "slow", slots=1, decode_tps=1, n_ctx=400)
    gw = g.start_gateway(gateway, [g.replica(dropper, decode_tps=2000), g.replica(quick, decode_tps=20),
                                   g.replica(slow, decode_tps=1)],
                         health={"interval_s": 0}, upstream={"stream_idle_timeout_s": limit},
                         scheduler={"expected_output_tokens": 100})
    body = fleet.chat_body("tell me a long story", model=g.MODEL, max_tokens=100, stream=True)
    body["stream_options"] = {"include_usage": True}
    r = requests.post(gw.url + "/v1/chat/completions", json=body, stream=True, timeout=T(60))
    assert r.status_code == 200 and r.headers["x-fleetgate-replica"] == "dropper", r.headers
    lines, ended = [], threading.Event()

    def read():
        try:
            for line in r.iter_lines(decode_unicode=True):
                lines.append(line)
        except requests.RequestException:
            pass
        ended.set()

    threading.Thread(target=read, daemon=True).start()
    assert fleet.wait_until(lambda: sum(1 for x in lines if x.startswith("data: {")) >= 3, T(10))
    # a long answer takes quick, the one phone whose context holds it: 4 x limit of its time
    long_r = []
    t = threading.Thread(target=lambda: long_r.append(
        g.chat(gw, "a long answer", max_tokens=int(800 * limit), timeout=T(60))), daemon=True)
    t.start()
    assert fleet.wait_until(lambda: g.sim_gauges(quick)[0] == 1, T(10)), "the long answer never went to quick"
    assert not ended.is_set() and sum(1 for x in lines if x.startswith("data: {")) < 50, \
        "the stream was nearly done before the dropper could drop it"
    dropper.proc.kill()  # the phone drops off the network mid-stream
    assert ended.wait(T(60)), "the stream never ended"
    data = [x[6:] for x in lines if x.startswith("data: ")]
    assert data and data[-1] == "[DONE]", data[-3:]
    chunks = [json.loads(d) for d in data[:-1]]
    assert not any("error" in c for c in chunks), [c for c in chunks if "error" in c]
    assert chunks[-1]["usage"]["completion_tokens"] == 100, chunks[-1]
    rec = g.access_log(gw, r.headers["x-request-id"])
    assert rec["status"] == 200 and rec["stream_continued"] >= 1 and rec["replica"] == "slow", rec
    t.join(T(60))
    assert long_r and long_r[0].status_code == 200, long_r


def test_a_stream_continues_again_after_its_first_silence_limit(sim, gateway):
    """A stream cut twice goes on twice: the silence limit that bounds its wait for a phone
    after a cut is given back once another phone takes it over (before: a second cut after
    the first limit had passed ended it with an error event, retries left or not)."""
    limit = T(0.3)
    drop1 = g.phone(sim, "drop1", slots=1, decode_tps=20, fault_plan=DROP_ALWAYS)
    # two tokens a second: cut 0.5-2 s after it takes over, past the first limit
    drop2 = g.phone(sim, "drop2", slots=1, decode_tps=0.2, fault_plan=DROP_ALWAYS)
    steady = g.phone(sim, "steady", slots=1, decode_tps=20)
    gw = g.start_gateway(gateway, [g.replica(drop1, decode_tps=2000), g.replica(drop2, decode_tps=1000),
                                   g.replica(steady)],
                         health={"interval_s": 0, "fall": 1}, upstream={"stream_idle_timeout_s": limit})
    r, res = stream(gw, max_tokens=40)
    chunks = unbroken(r, res, "drop1")
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(content) == 40, len(content)
    assert {c.get("system_fingerprint") for c in content} == {"drop1", "drop2", "steady"}
    rec = g.access_log(gw, r.headers["x-request-id"])
    assert rec["status"] == 200 and rec["stream_continued"] == 2 and rec["replica"] == "steady", rec
