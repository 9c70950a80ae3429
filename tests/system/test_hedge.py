"""Hedging: a phone that accepts a request and then says nothing (the sim's hang fault)
holds it only until its first byte is overdue by a margin derived from the prediction;
then a free phone that would finish it sooner is asked too, its answer wins, and the hung
attempt is cancelled at once, freeing the hung phone's slot, long before the first-byte
timeout. A stream hedges the same way before its first byte. Metrics count the hedges."""
import time

import pytest
import requests

import fleet
import gwutil as g
import test_admin as ta
from fleet import T

FOREVER = {"at_s": 0, "dur_s": 1e6}


def hung_and_spare(sim, gateway, **scheduler):
    # the hung phone is claimed far faster, so the planner sends it every request; no
    # health checks, so nothing but the hedge can take a request off it before its
    # first-byte timeout (timeout_min_s 30: over 30 s)
    hung = g.phone(sim, "hung", slots=1, fault_plan=[dict(FOREVER, kind="hang")])
    spare = g.phone(sim, "spare", slots=1)
    sched = {"hedge_budget": 1, "hedge_factor": 1.5, "hedge_min_s": 2}
    sched.update(scheduler)
    # a slot-second of the hung phone costs 1 (one slot, 86,400 a day); the spare is free
    return ta.start(gateway, [g.replica(hung, prefill_tps=100000, decode_tps=10000,
                                        cost_per_day=86400),
                              g.replica(spare)],
                    public_read=True, health={"interval_s": 0}, scheduler=sched,
                    upstream={"timeout_min_s": 30}, costs={"currency": "EUR"})


def hedges(admin):
    m = admin.metrics()
    return {k: m[f'fleetgate_hedges_total{{outcome="{k}"}}'] for k in ("started", "won", "wasted")}


def test_a_whole_answer_and_a_stream_are_answered_by_the_other_phone(sim, gateway):
    gw, admin = hung_and_spare(sim, gateway)
    assert hedges(admin) == {"started": 0, "won": 0, "wasted": 0}
    # a short prompt: overdue after half the margin, (0 + 2 s) / 2; spare then needs well
    # under a second, and the hung phone is expected to need a quarter of what it has run
    t0 = time.monotonic()
    r = g.chat(gw, "what is a hedge?", max_tokens=4, timeout=T(60))
    took = time.monotonic() - t0
    g.check_chat_ok(r, want_replica="spare")
    assert took < T(10), f"answered after {took:.1f} s (first-byte timeout over 30 s)"
    rec = g.access_log(gw, r.headers["x-request-id"])
    assert rec["status"] == 200 and rec["replica"] == "spare" and rec["attempts"] == 2, rec
    assert "last_error" not in rec, rec  # the hung attempt lost the race: no failure
    started = g.log_msgs(gw, "routing", decision="hedge", request_id=rec["request_id"])
    assert started and started[0]["overdue_replica"] == "hung", started
    assert started[0]["replica"] == "spare", started
    won = g.log_msgs(gw, "routing", decision="hedge_won", request_id=rec["request_id"])
    assert won and won[0]["other_replica"] == "hung", won
    # the hung phone's slot is free again at once, and it was not charged a failure
    reps = admin.replicas()
    assert reps["hung"]["slots_busy"] == 0, reps["hung"]
    assert reps["hung"]["failures"] == 0 and reps["hung"]["state"] == "ready", reps["hung"]
    assert hedges(admin) == {"started": 1, "won": 1, "wasted": 0}
    # slot time by kind of attempt: the hung one's wait (about a second, cancelled when the
    # hedge won) is regular work, the spare's answer is the hedge's
    m = admin.metrics()
    regular, hedge = (m[f'fleetgate_slot_seconds_total{{attempt="{k}"}}'] for k in ("regular", "hedge"))
    assert 0.8 <= regular <= took + 0.5 and 0 < hedge <= took, (regular, hedge, took)
    # the losing attempt's slot time is phone work (about the second it waited there);
    # the caller is charged once, for the answer it got
    c = admin.get("/admin/v1/costs").json()["hour"]["fleet"]
    assert c["requests"] == 1 and c["tokens"] == rec["tokens_in"] + rec["tokens_out"], c
    assert 0.8 <= c["busy_cost"] <= took + 0.5, (c, took)

    # a stream, before its first byte: the client's stream starts on the spare phone
    body = fleet.chat_body("stream me a hedge", model=g.MODEL, max_tokens=6, stream=True,
                           include_usage=True)
    t0 = time.monotonic()
    r = requests.post(gw.url + "/v1/chat/completions", json=body, stream=True, timeout=T(60))
    assert r.status_code == 200, r.text
    assert r.headers["x-fleetgate-replica"] == "spare", r.headers
    res = fleet.read_sse(r, timeout=T(30))
    took = time.monotonic() - t0
    assert res.done and res.error is None, res.data[-3:]
    chunks = res.chunks()
    assert {c.get("system_fingerprint") for c in chunks if c.get("choices")} == {"spare"}
    assert chunks[-1]["usage"]["completion_tokens"] == 6, chunks[-1]
    assert took < T(10), f"streamed after {took:.1f} s"
    rec = g.access_log(gw, r.headers["x-request-id"])
    assert rec["status"] == 200 and rec["replica"] == "spare" and "stream_continued" not in rec, rec
    assert admin.replicas()["hung"]["slots_busy"] == 0
    assert hedges(admin) == {"started": 2, "won": 2, "wasted": 0}
    assert not g.log_msgs(gw, "attempt failed"), g.log_msgs(gw, "attempt failed")


def test_no_budget_no_hedge(sim, gateway):
    # hedge_budget 0: the request waits on the hung phone until its first-byte timeout
    gw, admin = hung_and_spare(sim, gateway, hedge_budget=0)
    try:
        r = g.chat(gw, "what is a hedge?", max_tokens=4, timeout=6)
        raise AssertionError(f"answered within 6 s without a hedge: {r.status_code} {r.text}")
    except requests.exceptions.Timeout:
        pass
    assert hedges(admin) == {"started": 0, "won": 0, "wasted": 0}
    assert not g.log_msgs(gw, "routing", decision="hedge")


def test_a_phone_that_fails_a_health_check_is_hedged_at_once(sim, gateway):
    """A phone that stops answering (kill -STOP: a phone whose network dropped) while a
    request waits for its first byte: its next health check fails, and the request is
    hedged then, long before its first byte is overdue (hedge_min_s 30 here) and before
    the checks mark the phone down (fall 100)."""
    import signal

    hung = g.phone(sim, "frozen", slots=1)
    spare = g.phone(sim, "spare", slots=1)
    gw, admin = ta.start(gateway, [g.replica(hung, prefill_tps=100000, decode_tps=10000),
                                   g.replica(spare)],
                         public_read=True,
                         health={"interval_s": 0.3, "timeout_s": 0.3, "fall": 100},
                         scheduler={"hedge_budget": 1, "hedge_min_s": 30},
                         upstream={"timeout_min_s": 60})
    try:
        out = {}

        def send():
            t0 = time.monotonic()
            out["r"] = g.chat(gw, fleet.make_prompt(2000, tag="frozen"), max_tokens=8,
                              timeout=T(60))
            out["took"] = time.monotonic() - t0

        import threading
        th = threading.Thread(target=send)
        th.start()
        assert fleet.wait_until(lambda: admin.replicas()["frozen"]["slots_busy"] == 1, T(3))
        hung.proc.send_signal(signal.SIGSTOP)
        th.join(timeout=T(30))
        assert not th.is_alive()
        g.check_chat_ok(out["r"], want_replica="spare")
        # a failed check (0.3 s apart, 0.3 s timeout); with budget 1 on a fresh gateway the
        # hedge also waits until the frozen attempt has run as long as the spare's
        # predicted service (~1.1 s); then ~1.1 s on the spare. Its first byte would be
        # overdue only after 30 s.
        assert out["took"] < T(5), f"answered after {out['took']:.1f} s"
        rid = out["r"].headers["x-request-id"]
        started = g.log_msgs(gw, "routing", decision="hedge", request_id=rid)
        assert started and started[0]["overdue_replica"] == "frozen", started
        assert started[0]["why"] == "its phone failed a health check", started
        assert admin.replicas()["frozen"]["state"] == "ready"  # not (yet) marked down
        assert hedges(admin)["started"] == 1
    finally:
        hung.proc.send_signal(signal.SIGCONT)


def test_a_hedge_waits_for_the_phone_that_finishes_it_soonest(sim, gateway):
    """The phone a request waits on fails a health check, and the only free phone is a
    slow one: the hedge does not go there, though the budget would pay for it, but waits
    for the next slot of the phone that finishes it soonest, and takes it when it frees."""
    import signal
    import threading

    frozen = g.phone(sim, "frozen", slots=1, prefill_tps=400)
    fast = g.phone(sim, "fast", slots=1)
    slow = g.phone(sim, "slow", slots=1, prefill_tps=100, decode_tps=5)
    # frozen reads prompts 2x faster than fast, slow 2x slower
    gw, admin = ta.start(gateway, [g.replica(frozen), g.replica(fast), g.replica(slow)],
                         public_read=True,
                         health={"interval_s": 0.3, "timeout_s": 0.3, "fall": 100},
                         scheduler={"hedge_budget": 1, "hedge_min_s": 30},
                         upstream={"timeout_min_s": 60},
                         # each phone's work is counted: no checks' shadow requests beside it
                         verify={"enabled": False})
    # work done first (on frozen, ~1.1 s each), so that the budget (all of it, hedge_budget
    # 1) pays for a hedge on the slow phone (~4.4 s): before hedges waited, the hedge went
    # there at once
    for i in range(4):
        g.check_chat_ok(g.chat(gw, fleet.make_prompt(4000, tag=f"warm{i}"), max_tokens=8, timeout=T(30)))
    out = {}

    def send(name, prompt):
        t0 = time.monotonic()
        out[name] = g.chat(gw, prompt, max_tokens=8, timeout=T(60))
        out[name + "_took"] = time.monotonic() - t0

    try:
        r = threading.Thread(target=send, args=("r", fleet.make_prompt(4000, tag="waits")))
        r.start()
        assert fleet.wait_until(lambda: admin.replicas()["frozen"]["slots_busy"] == 1, T(3))
        # a longer request keeps the fast phone busy for about 1.6 s
        b = threading.Thread(target=send, args=("b", fleet.make_prompt(3000, tag="blocks")))
        b.start()
        assert fleet.wait_until(lambda: admin.replicas()["fast"]["slots_busy"] == 1, T(3))
        frozen.proc.send_signal(signal.SIGSTOP)
        r.join(timeout=T(30))
        b.join(timeout=T(30))
        assert not r.is_alive() and not b.is_alive()
        g.check_chat_ok(out["b"], want_replica="fast")
        g.check_chat_ok(out["r"], want_replica="fast")
        rid = out["r"].headers["x-request-id"]
        waits = g.log_msgs(gw, "routing", decision="hedge_wait", request_id=rid)
        assert waits and waits[0]["replica"] == "fast" and waits[0]["overdue_replica"] == "frozen", waits
        started = g.log_msgs(gw, "routing", decision="hedge", request_id=rid)
        assert len(started) == 1 and started[0]["replica"] == "fast", started
        # ~0.3-0.6 s to the failed check, ~1 s more for the fast phone, ~2.2 s there
        assert out["r_took"] < T(6), f"answered after {out['r_took']:.1f} s"
        s = admin.replicas()["slow"]
        assert s["successes"] == 0 and s["slots_busy"] == 0, s
        assert hedges(admin)["started"] == 1
        # the won hedge freed the frozen phone's slot; while its checks fail it takes no new
        # request, though it would finish it soonest (else the request would wait there for
        # its own hedge)
        assert admin.replicas()["frozen"]["slots_busy"] == 0
        q = g.chat(gw, fleet.make_prompt(2000, tag="after"), max_tokens=8, timeout=T(10))
        g.check_chat_ok(q, want_replica="fast")
        rec = g.access_log(gw, q.headers["x-request-id"])
        assert rec["attempts"] == 1, rec  # sent there, it would be hedged off it at once
        assert not g.log_msgs(gw, "routing", request_id=q.headers["x-request-id"],
                              overdue_replica="frozen")
    finally:
        frozen.proc.send_signal(signal.SIGCONT)


def test_a_phone_that_hangs_with_work_on_it_is_left_at_its_first_late_check(sim, gateway):
    """A phone with a request on it is checked every health.busy_interval_s, not every
    interval_s (30 s here: without the busy checks nothing would look at it before the
    request's first byte is overdue, hedge_min_s 30). It freezes (kill -STOP); its next
    check goes unanswered, and at health.late_s (0.5 s; its usual checks take
    milliseconds) the phone is suspect: the request hedges then, seconds before the check
    times out (timeout_s 10) and long before it is marked down. Its late check shows on
    the admin API, and when the phone thaws and answers, it is no longer suspect."""
    import signal
    import threading

    frozen = g.phone(sim, "frozen", slots=1)
    spare = g.phone(sim, "spare", slots=1)
    gw, admin = ta.start(gateway, [g.replica(frozen, prefill_tps=100000, decode_tps=10000),
                                   g.replica(spare)],
                         public_read=True,
                         health={"interval_s": 30, "busy_interval_s": 0.3, "late_s": 0.5,
                                 "timeout_s": 10, "fall": 2},
                         scheduler={"hedge_budget": 1, "hedge_min_s": 30},
                         upstream={"timeout_min_s": 60})
    try:
        # both phones pass their first check (every check so far took milliseconds)
        assert fleet.wait_until(lambda: all(r["probe_s"] is not None for r in admin.replicas().values()), T(5))
        out = {}

        def send():
            t0 = time.monotonic()
            out["r"] = g.chat(gw, fleet.make_prompt(2000, tag="frozen"), max_tokens=8, timeout=T(60))
            out["took"] = time.monotonic() - t0

        th = threading.Thread(target=send)
        th.start()
        assert fleet.wait_until(lambda: admin.replicas()["frozen"]["slots_busy"] == 1, T(3))
        frozen.proc.send_signal(signal.SIGSTOP)
        t_stop = time.monotonic()
        assert fleet.wait_until(lambda: admin.replicas()["frozen"]["suspect"], T(5))
        suspect_after = time.monotonic() - t_stop
        f = admin.replicas()["frozen"]
        assert f["state"] == "ready" or f["health"] == "ready", f  # not marked down for it
        assert "unanswered" in f["last_error"], f
        th.join(timeout=T(30))
        assert not th.is_alive()
        g.check_chat_ok(out["r"], want_replica="spare")
        # a busy check within ~0.3 s, late 0.5 s after it: suspect in about a second, far
        # under the 10 s timeout of that check
        assert suspect_after < T(3), f"suspect after {suspect_after:.1f} s"
        assert out["took"] < T(6), f"answered after {out['took']:.1f} s"
        rid = out["r"].headers["x-request-id"]
        started = g.log_msgs(gw, "routing", decision="hedge", request_id=rid)
        assert started and started[0]["overdue_replica"] == "frozen", started
        assert started[0]["why"] == "its phone's health check is late", started
        late = g.log_msgs(gw, "health check late: replica suspect", replica="frozen")
        assert late and late[0]["late_after_s"] == 0.5, late
        assert admin.replicas()["frozen"]["health"] == "ready"
    finally:
        frozen.proc.send_signal(signal.SIGCONT)
    # thawed, its late check answers: no longer suspect, and it serves again
    assert fleet.wait_until(lambda: not admin.replicas()["frozen"]["suspect"], T(15))
    g.check_chat_ok(g.chat(gw, fleet.make_prompt(500, tag="after"), max_tokens=8, timeout=T(10)))


def test_a_phone_is_checked_faster_only_while_it_has_work(sim, gateway):
    """Without work on it, a phone is checked every interval_s (30 s here), however short
    busy_interval_s is; while a request runs on it, every busy_interval_s (0.2 s). The
    sim logs each request it gets (debug), so its /health checks are counted."""
    from pathlib import Path

    d = g.phone(sim, "p", slots=1, extra_args=("--log-level", "debug"))
    gw, admin = ta.start(gateway, [g.replica(d)], public_read=True,
                         health={"interval_s": 30, "busy_interval_s": 0.2, "late_s": 0.5,
                                 "timeout_s": 10})

    def checks():
        text = Path(d.stdout_path).read_text(errors="replace") + Path(d.stderr_path).read_text(errors="replace")
        return text.count("GET /health")

    assert fleet.wait_until(lambda: admin.replicas()["p"]["probe_s"] is not None, T(5))
    time.sleep(1.5)
    idle = checks()
    assert 1 <= idle <= 2, idle  # the first check (and none since: 30 s apart)
    # a request of ~2 s on the phone: checked about every 0.2 s meanwhile
    t0 = time.monotonic()
    g.check_chat_ok(g.chat(gw, fleet.make_prompt(4000, tag="busy"), max_tokens=8, timeout=T(30)))
    took = time.monotonic() - t0
    busy = checks() - idle
    assert took > 1, took
    assert busy >= max(3, int(took / 0.2 / 3)), (busy, took)
    # idle again: back to interval_s
    n = checks()
    time.sleep(1.5)
    assert checks() - n <= 1


def test_a_phone_whose_answer_streams_is_not_checked_for_being_busy(sim, gateway):
    """Proof of life (docs/health.md): while a phone's answer streams, its bytes say it is
    alive, so it is not probed every busy_interval_s (0.2 s) as a phone reading a long
    prompt is (the test above): a stream of ~2 s costs it at most the check that goes out
    as the request does (nothing had been heard from it for busy_interval_s then), where
    every 0.2 s would be ten. The same phone reading a long prompt is still checked."""
    from pathlib import Path

    d = g.phone(sim, "p", slots=1, decode_tps=10, extra_args=("--log-level", "debug"))
    gw, admin = ta.start(gateway, [g.replica(d)], public_read=True,
                         health={"interval_s": 30, "busy_interval_s": 0.2, "late_s": 0.5,
                                 "timeout_s": 10})

    def checks():
        text = Path(d.stdout_path).read_text(errors="replace") + Path(d.stderr_path).read_text(errors="replace")
        return text.count("GET /health")

    assert fleet.wait_until(lambda: admin.replicas()["p"]["probe_s"] is not None, T(5))
    time.sleep(0.5)
    n = checks()
    t0 = time.monotonic()
    r = g.chat(gw, "tell me a long story", max_tokens=200, stream=True, timeout=T(30))
    assert r.status_code == 200, r.text
    res = fleet.read_sse(r, timeout=T(30))
    took = time.monotonic() - t0
    assert res.done and res.error is None, res.error
    assert took > 1.5, took  # 200 tokens at 100 a second
    streamed = checks() - n
    assert streamed <= 2, (streamed, took)
    # nothing flows while it reads a long prompt: checked every busy_interval_s again
    n = checks()
    t0 = time.monotonic()
    g.check_chat_ok(g.chat(gw, fleet.make_prompt(4000, tag="long"), max_tokens=8, timeout=T(30)))
    took = time.monotonic() - t0
    assert took > 1, took
    assert checks() - n >= max(3, int(took / 0.2 / 3)), (checks() - n, took)


@pytest.mark.parametrize("min_running", [2, 0])
def test_a_fresh_gateway_hedges_a_hung_phones_requests_beyond_its_budget(sim, gateway, min_running):
    """A gateway that just started has almost no hedge budget (a share of the work it has
    done). A 2-slot phone freezes with two requests on it; its checks turn late. With
    scheduler.hedge_min_running 2 both requests are hedged at once onto the two spare
    phones, beyond the budget; with 0 neither is (the budget alone), and they wait for
    the phone to be marked down (timeout_s 2, fall 2: seconds later)."""
    import signal
    import threading

    frozen = g.phone(sim, "frozen", slots=2)
    spares = [g.phone(sim, f"spare{i}", slots=1) for i in (1, 2)]
    gw, admin = ta.start(gateway, [g.replica(frozen, prefill_tps=100000, decode_tps=10000)] +
                         [g.replica(s) for s in spares], public_read=True,
                         health={"interval_s": 30, "busy_interval_s": 0.2, "late_s": 0.4,
                                 "timeout_s": 2, "fall": 2},
                         scheduler={"hedge_budget": 0.0001, "hedge_min_running": min_running,
                                    "hedge_min_s": 30},
                         upstream={"timeout_min_s": 60})
    assert fleet.wait_until(lambda: all(r["probe_s"] is not None for r in admin.replicas().values()), T(5))
    out = {}

    def send(i):
        t0 = time.monotonic()
        out[i] = (g.chat(gw, fleet.make_prompt(2000, tag=f"r{i}"), max_tokens=8, timeout=T(60)),)
        out[i] += (time.monotonic() - t0,)

    ths = [threading.Thread(target=send, args=(i,)) for i in range(2)]
    for th in ths:
        th.start()
    assert fleet.wait_until(lambda: admin.replicas()["frozen"]["slots_busy"] == 2, T(3))
    frozen.proc.send_signal(signal.SIGSTOP)
    try:
        for th in ths:
            th.join(timeout=T(30))
            assert not th.is_alive()
    finally:
        frozen.proc.send_signal(signal.SIGCONT)
    for i in range(2):
        g.check_chat_ok(out[i][0])
    started = g.log_msgs(gw, "routing", decision="hedge")
    moved = g.log_msgs(gw, "attempt failed", replica="frozen")
    if min_running:
        assert len(started) == 2 and {s["replica"] for s in started} == {"spare1", "spare2"}, started
        assert all(s["why"] == "its phone's health check is late" for s in started), started
        assert hedges(admin)["started"] == 2
        assert all(out[i][1] < T(4) for i in range(2)), [out[i][1] for i in range(2)]
        assert not moved, moved  # answered before the phone was marked down
    else:
        assert not started, started
        assert len(moved) == 2 and all(m["reason"] == "down" for m in moved), moved
        assert all(out[i][0].headers["x-fleetgate-replica"].startswith("spare") for i in range(2))
