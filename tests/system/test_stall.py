"""Phones that freeze mid-answer (kill -STOP on a sim: what a phone whose network drops
looks like to the gateway): a started stream goes on on another phone within seconds —
when it falls silent far beyond its phone's pace, or when health checks mark the phone
down — and a whole answer waiting on a frozen phone is retried elsewhere long before its
first-byte timeout. The client sees one complete answer."""
import signal
import threading
import time
from contextlib import contextmanager

import requests

import fleet
import gwutil as g
import test_admin as ta
from fleet import T


@contextmanager
def thawed_at_end(*daemons):
    """Whatever happens, a sim the test froze runs again before the teardown stops it."""
    try:
        yield
    finally:
        for d in daemons:
            if d.alive():
                d.proc.send_signal(signal.SIGCONT)


def stream_and_freeze(gw, victim, max_tokens, freeze_after):
    """Stream a chat answer from gw, SIGSTOP victim once freeze_after events arrived, read
    the rest. Returns (response, SSEResult, when it froze, arrival time of each event)."""
    body = fleet.chat_body("tell me a long story", model=g.MODEL, max_tokens=max_tokens,
                           stream=True, include_usage=True)
    r = requests.post(gw.url + "/v1/chat/completions", json=body, stream=True, timeout=T(60))
    assert r.status_code == 200, r.text
    res, buf, pending, times, frozen_at = fleet.SSEResult(), "", [], [], None
    deadline = time.monotonic() + T(60)
    try:
        for piece in r.iter_content(chunk_size=None):
            buf += piece.decode("utf-8", errors="replace")
            buf = buf.replace("\r\n", "\n")
            *lines, buf = buf.split("\n")
            fleet._feed_sse(res, lines, pending)
            times += [time.monotonic()] * (len(res.data) - len(times))
            if frozen_at is None and len(res.data) >= freeze_after:
                victim.send_signal(signal.SIGSTOP)
                frozen_at = time.monotonic()
            if time.monotonic() > deadline:
                res.timed_out = True
                break
    except (requests.exceptions.RequestException, OSError) as e:
        res.error = e
    assert frozen_at is not None, f"the stream ended before {freeze_after} events: {res.data}"
    return r, res, frozen_at, times


def check_whole_answer(res, max_tokens, phones):
    """One unbroken answer: [DONE], no error, one id, every token, written by both phones."""
    assert not res.timed_out and res.error is None, res.error
    assert res.done, f"no [DONE]: {res.data[-3:]}"
    chunks = res.chunks()
    assert not any("error" in c for c in chunks), [c for c in chunks if "error" in c]
    assert len({c["id"] for c in chunks}) == 1, {c["id"] for c in chunks}
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(content) == max_tokens, len(content)
    assert chunks[-1]["usage"]["completion_tokens"] == max_tokens, chunks[-1]
    fps = {c.get("system_fingerprint") for c in content}
    assert fps == set(phones), fps


def resumed_after(times, frozen_at, res):
    """Seconds from the freeze to the first event of the phone that took over."""
    for t, d in zip(times, res.data):
        if t > frozen_at and d != "[DONE]" and '"system_fingerprint":"steady"' in d:
            return t - frozen_at
    raise AssertionError("no event from the phone that took over")


def test_silent_stream_continues_on_another_phone_and_charges_the_frozen_one(sim, gateway):
    # the freezer is claimed much faster, so the stream starts there; no health checks:
    # only the silence watchdog can notice (stream_idle_timeout_s would take 30 s)
    freezer = g.phone(sim, "freezer", slots=1, decode_tps=4)  # 40 tokens/s in wall time
    steady = g.phone(sim, "steady", slots=1, decode_tps=4)
    gw, admin = ta.start(gateway, [g.replica(freezer, decode_tps=2000), g.replica(steady)],
                         public_read=True, health={"interval_s": 0},
                         upstream={"stream_idle_timeout_s": 30, "stream_silence_min_s": 1.5})
    with thawed_at_end(freezer):
        r, res, frozen_at, times = stream_and_freeze(gw, freezer, max_tokens=80, freeze_after=10)
        assert r.headers["x-fleetgate-replica"] == "freezer"
        check_whole_answer(res, 80, {"freezer", "steady"})
        # 1.5 s of silence, then the new phone reads the prompt and the text so far
        took = resumed_after(times, frozen_at, res)
        assert took < T(6), f"the stream went on only {took:.1f} s after the freeze"
        rec = g.access_log(gw, r.headers["x-request-id"])
        assert rec["status"] == 200 and rec["stream_continued"] >= 1 and "outcome" not in rec, rec
        assert rec["tokens_out"] == 80, rec
        fail = g.log_msgs(gw, "attempt failed", replica="freezer")
        assert fail and fail[0]["reason"] == "timeout" and fail[0]["stream_started"] is True, fail
        assert "fell silent" in fail[0]["detail"], fail[0]
        # the phone is charged a failure
        reps = admin.replicas()
        assert reps["freezer"]["failures"] >= 1, reps["freezer"]
        assert reps["steady"]["failures"] == 0, reps["steady"]
        m = admin.metrics()
        assert m['fleetgate_upstream_failures_total{reason="timeout"}'] >= 1


def test_stream_on_a_phone_marked_down_continues_at_once(sim, gateway):
    # the silence watchdog is off: the health checks marking the phone down move it
    freezer = g.phone(sim, "freezer", slots=1, decode_tps=4)
    steady = g.phone(sim, "steady", slots=1, decode_tps=4)
    gw = g.start_gateway(gateway, [g.replica(freezer, decode_tps=2000), g.replica(steady)],
                         health={"interval_s": 0.3, "timeout_s": 0.5, "fall": 2},
                         upstream={"stream_idle_timeout_s": 30, "stream_silence_factor": 0})
    with thawed_at_end(freezer):
        r, res, frozen_at, times = stream_and_freeze(gw, freezer, max_tokens=120, freeze_after=10)
        assert r.headers["x-fleetgate-replica"] == "freezer"
        check_whole_answer(res, 120, {"freezer", "steady"})
        took = resumed_after(times, frozen_at, res)
        assert took < T(8), f"the stream went on only {took:.1f} s after the freeze"
        down = g.log_msgs(gw, "replica state changed", replica="freezer", to="down")
        assert down, "the frozen phone was never marked down"
        fail = g.log_msgs(gw, "attempt failed", replica="freezer")
        assert fail and fail[0]["reason"] == "down" and fail[0]["stream_started"] is True, fail
        rec = g.access_log(gw, r.headers["x-request-id"])
        assert rec["status"] == 200 and rec["stream_continued"] >= 1 and "outcome" not in rec, rec


def test_whole_answer_on_a_frozen_phone_is_retried_long_before_its_timeout(sim, gateway):
    # the freezer claims to read prompts 10x faster than it does, so it gets the request
    # and is still reading the prompt (7.5 s) when it freezes; its first-byte timeout is
    # over 30 s; the steady phone claims to be slow but answers in under a second
    freezer = g.phone(sim, "freezer", slots=1, prefill_tps=20)
    steady = g.phone(sim, "steady", slots=1, prefill_tps=200)
    gw = g.start_gateway(gateway, [g.replica(freezer, prefill_tps=2000),
                                   g.replica(steady, prefill_tps=200)],
                         health={"interval_s": 0.3, "timeout_s": 0.5, "fall": 2},
                         upstream={"timeout_min_s": 30})
    out = {}

    def ask():
        out["r"] = g.chat(gw, fleet.make_prompt(1500, "frozen"), max_tokens=8, timeout=T(60))
        out["at"] = time.monotonic()

    with thawed_at_end(freezer):
        t = threading.Thread(target=ask)
        t.start()
        assert fleet.wait_until(lambda: g.sim_gauges(freezer)[0] == 1, T(5)), \
            "the request never reached the freezer"
        freezer.send_signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        t.join(T(60))
        r = out["r"]
        g.check_chat_ok(r, want_replica="steady")
        took = out["at"] - frozen_at
        assert took < T(8), f"answered {took:.1f} s after the freeze (first-byte timeout > 30 s)"
        rid = r.headers["x-request-id"]
        rec = g.access_log(gw, rid)
        assert rec["attempts"] == 2, rec
        # either hedged once the freezer's check failed or turned late (a fresh gateway may
        # run scheduler.hedge_min_running such hedges beyond its budget), or moved when it
        # was marked down: both long before the first-byte timeout
        hedged = g.log_msgs(gw, "routing", decision="hedge", request_id=rid)
        if hedged:
            assert hedged[0]["overdue_replica"] == "freezer" and "health check" in hedged[0]["why"], hedged
        else:
            assert rec["last_error"].startswith("freezer:"), rec
            fail = g.log_msgs(gw, "attempt failed", replica="freezer")
            assert fail and fail[0]["reason"] == "down" and fail[0]["stream_started"] is False, fail


def test_a_slow_phone_is_judged_by_its_own_pace(sim, gateway):
    # 2 tokens/s in wall time: half a second between tokens, longer than the floor given
    # here (0.3 s) but far within 10 gaps (5 s): the stream is slow, not silent
    slow = g.phone(sim, "slow", slots=1, decode_tps=0.2)
    other = g.phone(sim, "other", slots=1, decode_tps=0.2)
    gw = g.start_gateway(gateway, [g.replica(slow), g.replica(other, decode_tps=0.01)],
                         health={"interval_s": 0},
                         upstream={"stream_idle_timeout_s": 30, "stream_silence_min_s": 0.3})
    body = fleet.chat_body("tell me a slow story", model=g.MODEL, max_tokens=6, stream=True)
    r = requests.post(gw.url + "/v1/chat/completions", json=body, stream=True, timeout=T(60))
    assert r.status_code == 200, r.text
    res = fleet.read_sse(r, timeout=T(30))
    assert res.done and res.error is None, res.data[-3:]
    fps = {c.get("system_fingerprint") for c in res.chunks() if c.get("choices")}
    assert fps == {"slow"}, fps
    assert not g.log_msgs(gw, "attempt failed"), g.log_msgs(gw, "attempt failed")
