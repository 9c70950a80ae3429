"""What the gateway believes of a phone's speed before and beside what the phone says
(docs/routing.md "Priors, drift and exploration", docs/security.md "Untrusted answers"):
a phone added without rates to a busy fleet of fast phones starts from the fleet's
learned rates and gets work, and a phone whose timings lie is learned at the speed the
gateway's own clock saw, with the disagreement logged and counted."""

import json
import threading
import time

import pytest
import requests

import fleet
import gwutil as g
from fleet import T
from test_admin import start as start_admin
from test_registry import SECRET, SteadyLoad


@pytest.mark.parametrize("how", ["file", "heartbeat"])
def test_a_phone_added_without_rates_to_a_busy_fast_fleet_gets_work(sim, gateway, tmp_path, how):
    fast = [g.phone(sim, f"fast{i}") for i in range(3)]
    rdir = tmp_path / "replicas.d"
    rdir.mkdir()
    fleet_cfg = {"secret_env": "FG_SECRET", "heartbeat_interval_s": 1}
    d = gateway(lambda ports: g.gw_config(ports[0], [g.replica(p) for p in fast],
                                          replicas_dir=str(rdir), fleet=fleet_cfg),
                env={"FG_SECRET": SECRET}, ready=lambda d: (g.replicas_ready(d) or 0) >= 3)
    load = SteadyLoad(d, threads=6)  # more than the fast phones' 3 slots
    fleet.wait_until(lambda: all(load.served_by(p.id) >= 3 for p in fast), T(20),
                     what="the fast phones are learned")
    # two phones as fast as the others join: one says nothing of its speed, the other
    # is given the old defaults (50 and 5 tokens/s), which beside phones learned at
    # 2,000 and 100 never win a plan
    new, seeded = g.phone(sim, "new"), g.phone(sim, "seeded")
    entry = g.replica(new)
    del entry["prefill_tps"], entry["decode_tps"]
    slow_entry = g.replica(seeded, prefill_tps=50, decode_tps=5)
    stop = threading.Event()
    t_add = time.monotonic()
    if how == "file":
        (rdir / "new.json").write_text(json.dumps(entry))
        (rdir / "seeded.json").write_text(json.dumps(slow_entry))
    else:
        def beat():
            while not stop.is_set():
                for e in (entry, slow_entry):
                    body = dict(e, n_ctx=4096, state="ready")
                    raw, h = g.heartbeat_headers(body, secret=SECRET)
                    try:
                        requests.post(d.url + "/fleet/v1/heartbeat", data=raw, headers=h, timeout=T(5))
                    except requests.RequestException:
                        pass
                stop.wait(1.0)
        threading.Thread(target=beat, daemon=True).start()
    try:
        fleet.wait_until(lambda: (g.replicas_ready(d) or 0) >= 5, T(10),
                         what="the added phones are ready")
        fleet.wait_until(lambda: load.served_by("new") > 0, T(60), what="the new phone gets work")
        assert time.monotonic() - t_add < T(60)
        time.sleep(1.0)
        codes = load.finish()
    finally:
        stop.set()
    assert set(codes) == {200}, {c: codes.count(c) for c in set(codes)}
    assert load.served_by("new") > load.served_by("seeded"), (
        load.served_by("new"), load.served_by("seeded"))


def lie_forever():
    return [{"at_s": 0, "kind": "fast_timings", "dur_s": 1e6}]


def test_a_phone_whose_timings_lie_is_learned_at_its_true_speed(sim, gateway):
    # real time (scale 1): an answer takes ~1.3 s, its timings claim ~0.13 s
    honest = g.phone(sim, "honest", prefill_tps=200, decode_tps=20, scale=1)
    liar = g.phone(sim, "liar", prefill_tps=200, decode_tps=20, scale=1, fault_plan=lie_forever())
    d, adm = start_admin(gateway, [g.replica(honest), g.replica(liar)],
                         scheduler={"expected_output_tokens": 16})
    prompt = fleet.make_prompt(100, tag="t")
    codes, served, lock = [], [], threading.Lock()

    def worker(k):
        for i in range(4):
            r = g.chat(d, content=f"{k}{i} {prompt}", max_tokens=16, timeout=T(30))
            with lock:
                codes.append(r.status_code)
                served.append(r.headers.get("x-fleetgate-replica"))

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(T(60))
    assert codes == [200] * 8, codes
    assert served.count("liar") >= 2 and served.count("honest") >= 2, served
    reps = adm.replicas()
    # without the check the 2x floor would learn the liar at twice its speed; the phone's
    # own timings would say ten times
    for rid in ("liar", "honest"):
        assert 0.5 * 20 < reps[rid]["decode_tps"] < 1.5 * 20, (rid, reps[rid])
        assert 0.4 * 200 < reps[rid]["prefill_tps"] < 1.5 * 200, (rid, reps[rid])
    m = fleet.parse_prometheus(adm.metrics_text())
    assert m['fleetgate_timings_disagreed_total{replica="liar"}'] == served.count("liar"), m
    assert m['fleetgate_timings_disagreed_total{replica="honest"}'] == 0, m
    # logged once a minute, however often it lies
    lines = g.log_msgs(d, "timings disagreed: learned from the gateway's clock")
    assert len(lines) == 1, lines
    assert lines[0]["replica"] == "liar" and lines[0]["level"] == "warn", lines[0]
    assert lines[0]["observed_total_ms"] > 5 * (lines[0]["reported_prompt_ms"]
                                                + lines[0]["reported_predicted_ms"]), lines[0]


def _streamed_review(d, i, temperature=0.7, **kw):
    """A streamed 1,400-token review (a shared system prompt, its own case), read to its end."""
    system = "You review card transactions for fraud. Answer RISK_LEVEL 1-5. " * 12
    case = " ".join(f"case{i} item{k} amount{(k * 37 + i) % 997}" for k in range(300))
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": case}]
    r = g.chat(d, "x", messages=msgs, max_tokens=8, stream=True, temperature=temperature, timeout=T(60), **kw)
    assert r.status_code == 200, r.text
    r.content  # noqa: B018  (to its end: the final timings)
    return r.headers.get("x-fleetgate-replica")


def test_a_stream_the_engine_had_cached_teaches_no_false_prefill_pace(sim, gateway):
    """An engine warm from before the gateway started holds a prompt the gateway does not
    know it holds: the stream's first token comes at once, and counted on the whole prompt
    the gateway planned it to read, it taught a prefill pace many times the phone's (a
    phone then planned to read 7,000-token reviews in a fraction of a second took work it
    could not finish). Such a stream's prefill is learned from the engine's own count."""
    p = g.phone(sim, "warm", slots=1, prefill_tps=2000, decode_tps=40)
    first, _ = start_admin(gateway, [g.replica(p)])
    for i in range(3):
        _streamed_review(first, i)
    first.stop()
    # a new gateway (a restart): the phone's engine (one slot) still holds the last prompt
    d, adm = start_admin(gateway, [g.replica(p)])
    assert _streamed_review(d, 2) == "warm"
    got = adm.replicas()["warm"]["prefill_tps"]
    assert 0.5 * p.real_prefill < got < 2 * p.real_prefill, (got, p.real_prefill)


def test_answer_checks_of_streams_teach_no_false_prefill_pace(sim, gateway):
    """A check of a streamed answer sends a shadow to the phone that just answered it, whose
    engine holds the prompt: planned as a prompt read afresh (a pinned request was planned
    without the prompt cache), each shadow's first token taught a prefill pace ten times the
    phone's -- on a fresh gateway in B2 the budget phones were planned at 20 times their
    speed, took reviews they could not finish, and a review failed after two timeouts. A
    first token that beats its plan is counted at the stream's end on the tokens the engine
    says it read."""
    phones = [g.phone(sim, f"p{i}", slots=2, prefill_tps=2000, decode_tps=40) for i in range(3)]
    # told a quarter of their pace: each first token beats its plan, and the pace is learned
    # at each stream's end from what the engine says it read, on the gateway's clock
    d, adm = start_admin(gateway, [g.replica(p, prefill_tps=p.real_prefill / 4) for p in phones],
                         verify={"enabled": True, "newcomer_rate": 1.0, "trust_after": 1000})
    for i in range(9):
        _streamed_review(d, 100 + i)
    fleet.wait_until(lambda: adm.get("/admin/v1/quarantine").json()["stats"]["checks_running"] == 0,
                     T(30), what="the checks to end")
    st = adm.get("/admin/v1/quarantine").json()["stats"]
    assert st["checks"] >= 3 and st["agreed"] == st["checks"], st
    reps = adm.replicas()
    for p in phones:
        got = reps[p.id]["prefill_tps"]
        assert 0.4 * p.real_prefill < got < 2 * p.real_prefill, (p.id, got, p.real_prefill)


def test_a_stream_sent_with_cache_prompt_false_teaches_no_false_prefill_pace(sim, gateway):
    """A request that says "cache_prompt": false is read whole by the engine wherever it goes
    (a check's fresh re-ask, a canary asked afresh, a caller's): planned as a cache hit on
    the phone that read the prompt before, its first token came later than planned, and a
    stream taught a pace of the few tokens planned over the whole prompt's time."""
    p = g.phone(sim, "p", slots=1, prefill_tps=2000, decode_tps=40)
    d, adm = start_admin(gateway, [g.replica(p)])
    _streamed_review(d, 7)
    for _ in range(2):
        _streamed_review(d, 7, cache_prompt=False)
    got = adm.replicas()["p"]["prefill_tps"]
    assert 0.5 * p.real_prefill < got < 2 * p.real_prefill, (got, p.real_prefill)
