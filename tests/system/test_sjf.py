"""System tests of the queue's order within a class (docs/routing.md, section 2): under
overload short requests pass long ones that wait, the aging bound lets a long request
run while short ones keep coming, and a request whose deadline no phone can meet is
answered 503 `deadline_unreachable` at once — but never on rates nobody measured.

Sims run SCALE (10) times faster than real time; the gateway is told their wall-clock
rates (2,000 prompt and 100 output tokens/s), so a 2,000-token prompt reads in ~1 s."""

import threading
import time
from datetime import datetime

import pytest

import fleet
import gwutil as g
from fleet import T, make_prompt, wait_until
from gwutil import chat, check_chat_ok, check_error, phone, replica
from test_admin import start as start_admin


def readyz_queued(d):
    return d.get("/readyz", timeout=T(3)).json()["queued"]


class Runner:
    """Sends chat requests from threads; records (name, status, sent, done) of each."""

    def __init__(self, gw):
        self.gw = gw
        self.done = []
        self.lock = threading.Lock()
        self.threads = []

    def one(self, name, prompt, max_tokens):
        t0 = time.monotonic()
        r = chat(self.gw, prompt, max_tokens=max_tokens, timeout=T(60),
                 headers={"x-request-id": name})
        with self.lock:
            self.done.append((name, r.status_code, t0, time.monotonic()))

    def start(self, name, prompt, max_tokens):
        t = threading.Thread(target=self.one, args=(name, prompt, max_tokens))
        t.start()
        self.threads.append(t)

    def join(self):
        for t in self.threads:
            t.join(timeout=T(60))
        assert not any(t.is_alive() for t in self.threads), "a request never ended"


def test_short_requests_pass_long_ones_under_overload(sim, gateway):
    p = phone(sim, "sjf", slots=1)
    # aging_factor 4: a long request (~1.3 s) is passed by what arrives in the 5 s after it
    gw = g.start_gateway(gateway, [replica(p)], scheduler={"aging_factor": 4})
    run = Runner(gw)
    # five long requests (~1.3 s each: 2,000 prompt tokens, 30 out): the phone is busy ~6.5 s
    for i in range(5):
        run.start(f"long{i}", make_prompt(2000, tag=f"long{i}"), 30)
        if i == 0:  # on the phone (not merely not queued yet: long1 could overtake it)
            assert wait_until(lambda: g.sim_gauges(p)[0] == 1, T(3))
        assert wait_until(lambda: len(run.threads) - 1 == readyz_queued(gw), T(3))
    # eight short ones (~0.03 s each) arrive while four long ones wait
    for i in range(8):
        run.start(f"short{i}", make_prompt(20, tag=f"short{i}"), 2)
        time.sleep(0.15)
    run.join()
    assert all(s == 200 for _, s, _, _ in run.done), run.done
    order = [n for n, *_ in sorted(run.done, key=lambda x: x[3])]
    longs = [n for n in order if n.startswith("long")]
    # the long ones are all served, in their own arrival order
    assert longs == [f"long{i}" for i in range(5)], order
    # every short one ended before the third long one: it passed those that waited (in
    # arrival order each would have waited for all five, ~6.5 s)
    third = order.index("long2")
    late = [n for n in order[third:] if n.startswith("short")]
    assert not late, order
    for name, _, t0, t1 in run.done:
        if name.startswith("short"):
            assert t1 - t0 < T(3), (name, t1 - t0)


def test_aging_lets_a_long_request_run_while_short_ones_keep_coming(sim, gateway):
    p = phone(sim, "aging", slots=1)
    # aging_factor 1: the long request (~3 s) is passed only by requests arriving in the
    # 3 s after it
    gw = g.start_gateway(gateway, [replica(p)], scheduler={"aging_factor": 1})
    stop = threading.Event()
    shorts = []

    def closed_loop(k):
        # one short request (~0.3 s: 400 prompt tokens, 10 out) after another: with two
        # such clients a short one always waits when the phone frees up
        i = 0
        while not stop.is_set():
            r = chat(gw, make_prompt(400, tag=f"c{k}-{i}"), max_tokens=10, timeout=T(30))
            shorts.append((time.monotonic(), r.status_code))
            i += 1

    clients = [threading.Thread(target=closed_loop, args=(k,)) for k in range(2)]
    for c in clients:
        c.start()
    try:
        assert wait_until(lambda: len(shorts) >= 2, T(5)), shorts
        t0 = time.monotonic()
        r = chat(gw, make_prompt(2000, tag="long"), max_tokens=200, timeout=T(40))  # ~3 s
        took = time.monotonic() - t0
        check_chat_ok(r)
        served_meanwhile = sum(1 for t, _ in shorts if t > t0)
    finally:
        stop.set()
        for c in clients:
            c.join(timeout=T(30))
    # it waited for the shorts of its 3 s window, then ran: ~3 s + ~3 s, far from starved
    # (without aging it would wait as long as the short ones keep coming)
    assert took < T(12), f"the long request took {took:.1f} s"
    assert served_meanwhile >= 4, f"only {served_meanwhile} short requests were served meanwhile"
    assert all(s == 200 for _, s in shorts), shorts


def test_unreachable_deadline_is_answered_at_once(sim, gateway):
    p = phone(sim, "dl", slots=1)
    d, adm = start_admin(gateway, [replica(p)])
    long_prompt = make_prompt(3000, tag="review")  # ~1.5 s to read, + 50 out: ~2 s
    hurry = {"x-fleetgate-timeout": "0.5"}
    # rates nobody measured yet (a fresh fleet): never refused on that basis; the phone is
    # free, so it runs and is answered
    check_chat_ok(chat(d, long_prompt, max_tokens=50, headers=hurry, timeout=T(20)))
    assert adm.metrics().get("fleetgate_deadline_unreachable_total", 0) == 0
    # that answer taught both rates: now 2 s / margin 2 = 1 s > 0.5 s, refused at once
    t0 = time.monotonic()
    r = chat(d, make_prompt(3000, tag="review2"), max_tokens=50, headers=hurry, timeout=T(10))
    took = time.monotonic() - t0
    e = check_error(r, 503, code="deadline_unreachable", retry_after=True, what="unreachable")
    assert e["type"] == "server_error" and "deadline" in e["message"], e
    assert took < T(0.4), f"the 503 took {took:.2f} s"
    assert adm.metrics()["fleetgate_deadline_unreachable_total"] == 1
    # a deadline within reach (1 s < 3 s), and a short request in a hurry, are served
    check_chat_ok(chat(d, make_prompt(3000, tag="review3"), max_tokens=50,
                       headers={"x-fleetgate-timeout": "3"}, timeout=T(20)))
    check_chat_ok(chat(d, "quick", max_tokens=2, headers=hurry, timeout=T(10)))
    assert adm.metrics()["fleetgate_deadline_unreachable_total"] == 1
    rec = g.access_log(d, r.headers["x-request-id"])
    assert rec["status"] == 503 and rec["attempts"] == 0, rec


@pytest.mark.parametrize("warm", [True, False], ids=["short-work-seen", "fresh-gateway"])
def test_a_slot_is_kept_for_short_work(sim, gateway, warm):
    """scheduler.short_reserve: with short work coming in, long work leaves one of the
    quick phones' slots free (a quarter of 4 slots at most: 1), and a short request
    arriving while every other slot is busy is answered at once instead of waiting for a
    long one to end. A gateway that has just started keeps it too, before any short work
    came (it cannot know yet: short_recent_s). docs/routing.md, "Slots kept for short work"."""
    ps = [phone(sim, f"keep{i}", slots=1) for i in range(4)]
    gw = g.start_gateway(gateway, [replica(p) for p in ps], scheduler={"short_s": 0.2})
    if warm:
        check_chat_ok(chat(gw, make_prompt(20, tag="first"), max_tokens=2, timeout=T(10)))
    run = Runner(gw)
    for i in range(4):  # ~1.3 s each (2,000 prompt tokens, 30 out)
        run.start(f"long{i}", make_prompt(2000, tag=f"keep-long{i}"), 30)
    # three run, the fourth waits: the last free slot is kept
    assert wait_until(lambda: readyz_queued(gw) == 1, T(3))
    time.sleep(0.2)
    assert readyz_queued(gw) == 1
    run.start("short", make_prompt(20, tag="keep-short"), 2)
    run.join()
    assert all(s == 200 for _, s, _, _ in run.done), run.done
    order = [n for n, *_ in sorted(run.done, key=lambda x: x[3])]
    assert order[0] == "short", order
    (_, _, t0, t1), = [x for x in run.done if x[0] == "short"]
    assert t1 - t0 < T(0.8), f"the short request took {t1 - t0:.2f} s"
    # the other three went at once; one long request waited in the queue while the kept slot
    # stayed free, and went only once the short request had taken it (then the first slot to
    # free: the short one's, or a long one's): its wait is the time from its arrival to then,
    # not a fixed figure (a slow machine spaces the four arrivals further apart)
    lines = sorted((g.access_log(gw, f"long{i}") for i in range(4)), key=lambda x: x["queue_wait_ms"])
    waits = [x["queue_wait_ms"] for x in lines]
    assert waits[3] > 200 and waits[2] < 500, waits
    short = g.access_log(gw, "short")
    assert short["queue_wait_ms"] < 300

    def dispatched(x):  # the line is written as the request ends: ts - its time on a phone
        end = datetime.strptime(x["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
        return end - (x["duration_ms"] - x["queue_wait_ms"]) / 1000

    assert dispatched(lines[3]) >= dispatched(short) - 0.02, (waits, dispatched(lines[3]), dispatched(short))


def test_short_work_a_slower_phone_took_still_keeps_a_slot(sim, gateway):
    """Short work is short on the quickest phone, wherever it goes: a guard's message that
    a slow phone takes (every quick slot busy, the slow one free; 0.33 s there, over
    short_s) is short work come lately all the same, so when the quick phones' slots free
    one stays kept for the next message. Counted by the phone it went to, it was not: once
    longer work had the quick slots, short work stopped "coming" and nothing was kept (on
    B7's fleets at a real pace the filters waited a review's length). docs/routing.md,
    "Slots kept for short work"."""
    fast = [phone(sim, f"sw-fast{i}", slots=1) for i in range(4)]            # 2,000 / 100 tok/s
    slow = phone(sim, "sw-slow", slots=1, prefill_tps=15, decode_tps=1.0)    # 150 / 10 tok/s
    gw = g.start_gateway(gateway, [replica(p) for p in fast + [slow]],
                         scheduler={"short_s": 0.2, "short_recent_s": 4, "explore_cost": 0},
                         verify={"enabled": False})  # no newcomer held for its checks
    time.sleep(4.3)  # past the gateway's first short_recent_s: nothing kept before short work
    run = Runner(gw)
    for i in range(4):  # ~1.3 s each on a fast phone (2,000 prompt tokens, 30 out), ~16 s on slow
        run.start(f"a{i}", make_prompt(2000, tag=f"sw-a{i}"), 30)
    assert wait_until(lambda: sum(g.sim_gauges(p)[0] for p in fast) == 4, T(3))
    assert readyz_queued(gw) == 0  # nothing kept: all four on the fast phones at once
    # the message: 0.03 s on a fast phone, 0.33 s on the free slow one, which takes it
    run.start("short", make_prompt(20, tag="sw-short"), 2)
    assert wait_until(lambda: any(n == "short" for n, *_ in run.done), T(5))
    for i in range(4):  # four more long requests wait for the fast phones
        run.start(f"b{i}", make_prompt(2000, tag=f"sw-b{i}"), 30)
    run.join()
    assert all(st == 200 for _, st, _, _ in run.done), run.done
    assert g.access_log(gw, "short")["replica"] == "sw-slow"
    lines = [g.access_log(gw, f"b{i}") for i in range(4)]
    assert all(x["replica"].startswith("sw-fast") for x in lines), lines
    # three take the fast slots as the first four end; one is kept for short work, and the
    # fourth goes only when another fast slot frees, a long request's time later (counted
    # by the phone the message went to: all four as the first four end, within 10 ms)

    def ts(x):
        return datetime.strptime(x["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
    last_end = max(ts(g.access_log(gw, f"a{i}")) for i in range(4))
    last_go = max(ts(x) - (x["duration_ms"] - x["queue_wait_ms"]) / 1000 for x in lines)
    assert last_go - last_end > 0.5, (last_go - last_end, [x["queue_wait_ms"] for x in lines])


def test_no_slot_is_kept_without_short_work_or_when_off(sim, gateway):
    """A fleet that serves no short work keeps nothing once short_recent_s has passed since
    the gateway started (short work that came longer ago than that keeps nothing either);
    short_reserve 0 keeps nothing."""
    for name, conf, warm in (("none-seen", {"short_s": 0.2, "short_recent_s": 1}, False),
                             ("seen-long-ago", {"short_s": 0.2, "short_recent_s": 1}, True),
                             ("off", {"short_s": 0.2, "short_reserve": 0}, True)):
        ps = [phone(sim, f"{name}{i}", slots=1) for i in range(4)]
        gw = g.start_gateway(gateway, [replica(p) for p in ps], scheduler=conf)
        if warm:
            check_chat_ok(chat(gw, make_prompt(20, tag=f"{name}-first"), max_tokens=2, timeout=T(10)))
        if "short_recent_s" in conf:
            time.sleep(1.3)  # past the gateway's start, and past the short request
        run = Runner(gw)
        for i in range(4):
            run.start(f"long{i}", make_prompt(2000, tag=f"{name}-long{i}"), 30)
        run.join()
        assert all(s == 200 for _, s, _, _ in run.done), (name, run.done)
        # all four dispatched at once: none waited for a slot (a kept one would, ~1.3 s)
        waits = [g.access_log(gw, f"long{i}")["queue_wait_ms"] for i in range(4)]
        assert max(waits) < 500, (name, waits)


@pytest.mark.parametrize("weight", [2, 1], ids=["weighed", "plain"])
def test_a_chat_takes_a_free_slower_phone_while_a_review_waits_for_the_fast_one(sim, gateway, weight):
    """scheduler.wait_weight_max: a review runs on the fast phone and another waits for
    it; a chat (shorter, not short) arriving then weighs its own wait for the fast phone
    by the review's time over its own (at most 2) and takes the free slow phone, which
    finishes it a little later than waiting would, and leaves the fast phone to the
    review. With 1 it plans on plain finish times and queues for the fast phone too.
    docs/routing.md, "Waiting for a faster phone"."""
    fast = phone(sim, "ww-fast", slots=1, prefill_tps=50, decode_tps=5)    # 500 / 50 tok/s
    slow = phone(sim, "ww-slow", slots=1, prefill_tps=15, decode_tps=1.0)  # 150 / 10 tok/s
    # explore_cost 0: the slow phone (never measured) is not tried for its own sake;
    # expected_output_tokens 1000: the chat is planned at its cap; short_s 1: it is not
    # short; aging_factor 4: the chat, shorter, is planned before the waiting review;
    # fill_idle false: the wait weight alone decides (with the queue planned as a whole the
    # idle slow phone takes the chat either way: the fast one cannot clear its queue of
    # ~7.6 s of work before the slow one would finish the chat; routing.md)
    gw = g.start_gateway(gateway, [replica(fast), replica(slow)],
                         scheduler={"wait_weight_max": weight, "explore_cost": 0, "short_s": 1,
                                    "expected_output_tokens": 1000, "aging_factor": 4,
                                    "fill_idle": False})
    got = {}

    def send(name, prompt, max_tokens):
        r = chat(gw, prompt, max_tokens=max_tokens, timeout=T(60), headers={"x-request-id": name})
        got[name] = (r.status_code, r.headers.get("x-fleetgate-replica"))

    threads = []

    def start(*a):
        threads.append(threading.Thread(target=send, args=a))
        threads[-1].start()

    # a review: 3,000 prompt tokens, 2 out: ~6 s on fast, ~20 s on slow
    start("review0", make_prompt(3000, tag="ww-review0"), 2)
    assert wait_until(lambda: g.sim_gauges(fast)[0] == 1, T(3))
    t0 = time.monotonic()
    start("review1", make_prompt(3000, tag="ww-review1"), 2)  # waits for fast (~12 s vs ~20 s)
    assert wait_until(lambda: readyz_queued(gw) == 1, T(3))
    # the chat, ~1 s into review0 (fast frees in ~5 s): 100 prompt tokens, 70 out, ~1.6 s
    # on fast, ~7.7 s on slow. Plain: 5 + 1.6 = 6.6 s beats 7.7 s, it waits (whenever it
    # comes: at most 6 + 1.6); weighed by min(2, 6 / 1.6): 2 x 5 + 1.6 = 11.6 s does not
    # (while it comes less than ~3 s into review0)
    time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
    start("chat", make_prompt(100, tag="ww-chat"), 70)
    for t in threads:
        t.join(timeout=T(60))
    assert not any(t.is_alive() for t in threads), got
    assert all(s == 200 for s, _ in got.values()), got
    assert got["review0"][1] == "ww-fast" and got["review1"][1] == "ww-fast", got
    assert got["chat"][1] == ("ww-slow" if weight == 2 else "ww-fast"), got
