"""Answers verified (issue #32, docs/routing.md "Answers verified"): a phone that fakes its
answers (the sim's `fake` fault: a fixed text at once, with usage and timings that agree
with the clock) or runs another model (`substitute`) beside three honest phones is found by
cross-checks under deterministic decoding, loses the vote, is quarantined within 20 of its
answers and then serves nothing; the requests it answered are listed for review; a batch
run while it is in the fleet keeps none of its lines; an honest phone is never accused;
canaries with known answers catch a phone that answers them wrong."""
import concurrent.futures
import json
import time

import pytest
import requests

import fleet
import gwutil as g
import test_admin as ta
from fleet import T, wait_until

FOREVER = {"at_s": 0, "dur_s": 1e6}
REVIEW = ("Fraud review {i}: card ending {c:04d}, {n} purchases in {m} minutes from a new "
          "device, shipping address differs from billing. Answer RISK_LEVEL 1-5 and a reason.")


def honest_phones(sim, n=3):
    return [g.phone(sim, f"honest{i}", slots=2, prefill_tps=2000, decode_tps=40) for i in range(n)]


def review(i):
    return REVIEW.format(i=i, c=(i * 7919) % 10000, n=2 + i % 9, m=1 + i % 30)


def send_reviews(gw, n, start=0, workers=4, temperature=0.7, max_tokens=12):
    """n reviews, `workers` at once, in order of sending: [(request id, replica)]."""
    def one(i):
        r = g.chat(gw, review(start + i), max_tokens=max_tokens, timeout=T(120), temperature=temperature)
        assert r.status_code == 200, r.text
        return r.headers["x-request-id"], r.headers["x-fleetgate-replica"]

    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        return list(ex.map(one, range(n)))


def verify_conf(**over):
    v = {"enabled": True}
    v.update(over)
    return v


def quarantined(admin):
    r = admin.get("/admin/v1/quarantine")
    assert r.status_code == 200, r.text
    return {p["id"]: p for p in r.json()["quarantined"]}


def check_caught(gw, admin, served, bad):
    """bad is quarantined within 20 of its answers, serves at most 2 of the last 40, every
    request it answered is listed for review, and no honest phone is quarantined."""
    q = quarantined(admin)
    assert set(q) == {bad}, (q, served[-40:])
    ev = q[bad]["evidence"]
    assert ev and ev[-1]["its_answer"] != ev[-1].get("majority_answer"), ev
    assert ev[-1]["request_id"] and ev[-1]["shadow_request_ids"], ev
    mine = [rid for rid, rep in served if rep == bad]
    assert len(mine) <= 20, f"{bad} answered {len(mine)} requests before it was quarantined"
    last = [rep for _, rep in served[-40:]]
    assert last.count(bad) <= 2, last
    r = admin.get(f"/admin/v1/quarantine/{bad}/answers")
    assert r.status_code == 200, r.text
    listed = {a["request_id"] for a in r.json()["answers"]}
    assert set(mine) <= listed, (mine, listed)
    assert all(a["at_ms"] > 0 for a in r.json()["answers"])
    reps = admin.replicas()
    assert reps[bad]["state"] == "quarantined" and reps[bad]["quarantined"], reps[bad]
    for rid, rep in reps.items():
        if rid != bad:
            assert not rep["quarantined"], rep
    m = admin.metrics()
    assert m["fleetgate_verify_quarantines_total"] == 1, m
    assert m['fleetgate_verify_votes_total{result="lost"}'] >= 1, m
    # an honest phone's answers are listed nowhere: it is not quarantined
    assert admin.get("/admin/v1/quarantine/honest0/answers").status_code == 404


@pytest.mark.parametrize("fault", ["fake", "substitute"])
def test_a_faker_in_the_replica_file_is_quarantined(sim, gateway, fault):
    honest = honest_phones(sim)
    bad = g.phone(sim, "bad", slots=2, prefill_tps=2000, decode_tps=40,
                  fault_plan=[dict(FOREVER, kind=fault)])
    gw, admin = ta.start(gateway, [g.replica(d) for d in honest + [bad]], verify=verify_conf())
    served = send_reviews(gw, 60)
    served += send_reviews(gw, 40, start=60)
    wait_until(lambda: "bad" in quarantined(admin), T(30), what="the faker's quarantine")
    check_caught(gw, admin, served, "bad")
    # it gets no work, and an operator's release lets it take work again
    assert admin.post("/admin/v1/quarantine/honest1/release").status_code == 409
    r = admin.post("/admin/v1/quarantine/bad/release")
    assert r.status_code == 200 and r.json()["state"] == "released", r.text
    assert admin.replicas()["bad"]["state"] != "quarantined"
    assert quarantined(admin) == {}


def test_no_honest_phone_is_accused_under_deterministic_and_sampled_traffic(sim, gateway):
    honest = honest_phones(sim, 4)
    gw, admin = ta.start(gateway, [g.replica(d) for d in honest],
                         verify=verify_conf(newcomer_rate=1.0, trust_after=1000))
    send_reviews(gw, 40, temperature=0)
    send_reviews(gw, 40, start=40, temperature=0.9)
    r = g.chat(gw, review(999), max_tokens=12, stream=True, temperature=0.5, timeout=T(60))
    assert r.status_code == 200
    r.content  # noqa: B018  (read the stream to its end)
    wait_until(lambda: admin.get("/admin/v1/quarantine").json()["stats"]["checks_running"] == 0,
               T(60), what="the checks to end")
    st = admin.get("/admin/v1/quarantine").json()
    assert st["quarantined"] == [], st
    s = st["stats"]
    assert s["checks"] >= 20 and s["agreed"] == s["checks"] and s["disagreed"] == 0, s
    assert s["quarantines"] == 0 and s["votes"] == 0, s
    for p in st["phones"]:
        assert p["votes_lost"] == 0 and p["strikes"] == 0, p
    # an agreement is a pass of the checked phone only: a witness earns no record by
    # agreeing (ids that agree on their fakes would vouch for each other twice as fast)
    assert sum(p["checks_passed"] for p in st["phones"]) == s["agreed"], st


def test_a_sampled_answers_shadows_decode_only_what_is_compared(sim, gateway):
    """A check of a sampled request sends two shadows at temperature 0; each decodes at most
    verify.shadow_max_tokens (here 16 of the caller's 60 tokens), both stop at the same
    token and agree. A request at temperature 0 is checked with shadows as the caller sent
    it (a cap it did not send would tell them apart): one shadow against the caller's own
    answer, or a pair for a stream; so is one with tools."""
    honest = honest_phones(sim, 3)
    gw, admin = ta.start(gateway, [g.replica(d) for d in honest],
                         verify=verify_conf(newcomer_rate=1.0, trust_after=1000, shadow_max_tokens=16,
                                            compare_words=8))
    tool = [{"type": "function", "function": {"name": "score", "parameters": {"type": "object"}}}]
    seen = 0
    for temperature, stream, tools, want in ((0.9, False, None, 16), (0, False, None, 60),
                                             (0, True, None, 60), (0.9, False, tool, 60)):
        for i in range(6):
            kw = {"tools": tools, "tool_choice": "none"} if tools else {}
            r = g.chat(gw, review(i), max_tokens=60, timeout=T(60), temperature=temperature,
                       stream=stream, **kw)
            assert r.status_code == 200, r.text
            if not stream:
                assert r.json()["usage"]["completion_tokens"] == 60, r.text
            r.content  # noqa: B018  (a stream read to its end)
        wait_until(lambda: admin.get("/admin/v1/quarantine").json()["stats"]["checks_running"] == 0,
                   T(60), what="the checks to end")
        shadows = g.log_msgs(gw, "shadow request")
        late, seen = shadows[seen:], len(shadows)
        assert late, f"no check at temperature {temperature}, stream {stream}, tools {bool(tools)}"
        assert {s["tokens_out"] for s in late} == {want}, (temperature, stream, tools, late)
    s = admin.get("/admin/v1/quarantine").json()["stats"]
    assert s["checks"] >= 4 and s["agreed"] == s["checks"] and s["disagreed"] == 0, s


def test_a_substitute_is_caught_by_capped_shadows(sim, gateway):
    """Sampled answers longer than the shadows' cap: the checks, votes and fresh checks all
    decode the cap (16 tokens of the callers' 24), and the phone running another model still
    loses its votes and is quarantined within 20 of its answers."""
    honest = honest_phones(sim)
    bad = g.phone(sim, "bad", slots=2, prefill_tps=2000, decode_tps=40,
                  fault_plan=[dict(FOREVER, kind="substitute")])
    gw, admin = ta.start(gateway, [g.replica(d) for d in honest + [bad]],
                         verify=verify_conf(shadow_max_tokens=16, compare_words=8))
    served = send_reviews(gw, 60, max_tokens=24)
    served += send_reviews(gw, 40, start=60, max_tokens=24)
    wait_until(lambda: "bad" in quarantined(admin), T(30), what="the substitute's quarantine")
    check_caught(gw, admin, served, "bad")
    # (a shadow pinned to the phone once it is quarantined is refused: no answer)
    shadows = [s for s in g.log_msgs(gw, "shadow request") if s["status"] == 200]
    assert shadows and {s["tokens_out"] for s in shadows} == {16}, shadows


def test_a_batch_keeps_no_line_of_a_faker(sim, gateway, tmp_path):
    import test_batch as tb  # noqa: PLC0415  (the Batch API's helpers)
    honest = honest_phones(sim)
    bad = g.phone(sim, "bad", slots=2, prefill_tps=2000, decode_tps=40,
                  fault_plan=[dict(FOREVER, kind="fake")])
    d = tb.start_batch_gw(gateway, tmp_path / "data", [g.replica(x) for x in honest + [bad]],
                          admin=True, verify=verify_conf())
    lines = [tb.line(f"r{i}", review(i), max_tokens=12, temperature=0.7) for i in range(200)]
    fid = tb.upload_ok(d, tb.jsonl(lines))["id"]
    b = tb.create_ok(d, fid)
    b = tb.wait_batch(d, b["id"], timeout=240)
    assert b["status"] == "completed", b
    out, err = tb.results(d, b)
    assert err == [] and len(out) == 200, (len(out), err[:3])
    assert sorted(x["custom_id"] for x in out) == sorted(f"r{i}" for i in range(200))
    texts = [tb.check_output_line(x)["choices"][0]["message"]["content"] for x in out]
    assert not [t for t in texts if "RISK_LEVEL: 1" in t], "a faker's line is in the output"
    assert b["request_counts"] == {"total": 200, "completed": 200, "failed": 0}, b
    assert set(quarantined(d.admin)) == {"bad"}
    # it did answer lines before it was caught: they were taken out and run again
    again = g.log_msgs(d, "batch lines run again")
    answered_by_bad = [r for r in g.log_msgs(d, "request", replica="bad", status=200)
                       if r["priority"] == "batch"]
    assert answered_by_bad and again, (len(answered_by_bad), again)


def test_a_faker_that_joins_by_heartbeat_later_is_quarantined_and_stays_so(sim, gateway):
    import test_attack_identity as ti  # noqa: PLC0415  (signed heartbeats)
    honest = honest_phones(sim)
    bad = g.phone(sim, "bad", slots=2, prefill_tps=2000, decode_tps=40,
                  fault_plan=[dict(FOREVER, kind="fake")])
    fl = {"secret_env": "FG_SECRET", "heartbeat_timeout_s": 300, "heartbeat_interval_s": 0.2}

    def conf(ports):
        return ta.admin_config(ports, [g.replica(d) for d in honest], verify=verify_conf(), fleet=fl)

    gw = gateway(conf, n_ports=2, env={ta.TOKEN_ENV: ta.TOKEN, "FG_SECRET": ti.SECRET},
                 ready=lambda d: (g.replicas_ready(d) or 0) >= 3)
    admin = ta.Admin(gw)
    served = send_reviews(gw, 30)
    body = ti.body_of("bad", bad.url, slots=2)
    assert ti.beat(gw, body, secret=ti.SECRET).status_code == 200
    assert wait_until(lambda: "bad" in admin.replicas() and admin.replicas()["bad"]["state"] == "ready",
                      T(10)), admin.replicas().get("bad")
    # twice as many at once as the honest phones have slots (6): once they pass checks, a
    # phone without a record is planned at no more than the fleet's pace however fast it
    # answers, and with 4 at once the faker may be needed for nothing -- in a loaded
    # sanitizer CI run of the Redis test below it answered 2, was never due a check, and was
    # not quarantined (this test failed alike once, its output saying no more)
    served += send_reviews(gw, 60, start=30, workers=12)
    served += send_reviews(gw, 40, start=90, workers=12)
    if not wait_until(lambda: "bad" in quarantined(admin), T(30)):
        # once in a loaded sanitizer run the faker was not quarantined: say what it did
        seen = [{k: r.get(k) for k in ("ts", "msg", "request_id", "outcome", "charged", "state", "reason", "to")}
                for r in g.log_records(gw) if r.get("replica") == "bad"]
        pytest.fail(f"the faker was not quarantined; it answered {[x for x in served if x[1] == 'bad']}; "
                    f"its state {admin.replicas().get('bad')}; the gateway's log of it: {seen[-40:]}")
    check_caught(gw, admin, served, "bad")
    # its pin stays: its next heartbeat (same key) finds it quarantined, it takes no work
    time.sleep(0.3)
    assert ti.beat(gw, body).status_code == 200
    assert admin.replicas()["bad"]["state"] == "quarantined"
    assert admin.get("/admin/v1/enrolments/bad").json()["state"] == "pinned"
    last = send_reviews(gw, 12, start=200)
    assert "bad" not in {rep for _, rep in last}


def test_canaries_catch_a_phone_that_answers_them_wrong(sim, gateway, tmp_path):
    honest = honest_phones(sim, 2)
    bad = g.phone(sim, "bad", slots=2, prefill_tps=2000, decode_tps=40,
                  fault_plan=[dict(FOREVER, kind="substitute")])
    # the operator knows the model's answer to its canary (here: what an honest phone says)
    prompt = "Canary: is a refund after a chargeback a risk? Answer in one line."
    r = honest[0].post("/v1/chat/completions", json={
        "model": g.MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 16,
        "temperature": 0}, timeout=T(10))
    expected = r.json()["choices"][0]["message"]["content"]
    first = expected.split()[0]
    canaries = tmp_path / "canaries.json"
    canaries.write_text(json.dumps([
        {"model": g.MODEL, "prompt": prompt, "expect": expected, "max_tokens": 16},
        {"model": g.MODEL, "prompt": prompt, "expect_regex": "^" + first + " ", "max_tokens": 16},
    ]))
    gw, admin = ta.start(gateway, [g.replica(d) for d in honest + [bad]],
                         verify=verify_conf(canaries_file=str(canaries), canary_interval_s=1))
    wait_until(lambda: "bad" in quarantined(admin), T(60), what="the canaries' verdict")
    q = quarantined(admin)["bad"]
    assert [e["kind"] for e in q["evidence"]] == ["canary", "canary"], q
    assert q["evidence"][0]["its_answer"] != expected
    st = {p["id"]: p for p in admin.get("/admin/v1/quarantine").json()["phones"]}
    wait_until(lambda: all(p["canaries"] >= 1 for p in admin.get("/admin/v1/quarantine").json()["phones"]
                           if p["id"] != "bad"), T(30), what="canaries on the honest phones")
    st = {p["id"]: p for p in admin.get("/admin/v1/quarantine").json()["phones"]}
    for h in ("honest0", "honest1"):
        assert st[h]["canaries_failed"] == 0 and st[h]["state"] != "quarantined", st[h]
    # a canary looks like a caller's request to the phone: no marker, a request id like theirs
    ids = [x["request_id"] for x in g.log_msgs(honest[0], "request") if x.get("request_id")]
    assert ids and all(i.startswith("req-") for i in ids), ids
    m = admin.metrics()
    assert m['fleetgate_verify_canaries_total{result="failed"}'] >= 2, m


def test_a_bad_canaries_file_stops_the_start(gateway, tmp_path):
    bad = tmp_path / "canaries.json"
    bad.write_text(json.dumps([{"model": "m", "prompt": "x"}]))
    cfg = tmp_path / "fleetgate.json"
    cfg.write_text(json.dumps(g.gw_config(fleet.free_port(), [], verify={"canaries_file": str(bad)})))
    import subprocess  # noqa: PLC0415
    p = subprocess.run([fleet.gateway_bin(), "--config", str(cfg)], capture_output=True, text=True,
                       timeout=T(20), stdin=subprocess.DEVNULL)
    assert p.returncode != 0, p.stderr
    assert "canaries" in p.stderr and "expect" in p.stderr, p.stderr


def real_engines_checked_always(procs, gateway, tmp_path):
    """llama-server b10587 behind three agents, engines on 1, 2 and 1 threads (a check
    needs three phones: a disagreement is decided by a third), and a gateway checking every
    answer it can: (gateway, Admin). Fails under CI=true without the engine."""
    import llama  # noqa: PLC0415
    try:
        e = llama.prepare(tmp_path / "engine", release="2026")
    except llama.EngineMissing as err:
        if llama.in_ci():
            pytest.fail(f"CI=true and the real llama-server cannot run: {err}", pytrace=False)
        pytest.skip(f"real llama-server not available: {err}")
    agents = [llama.start_agent(procs, e, tmp_path, name, slots=n, alias=g.MODEL, threads=t)
              for name, n, t in (("t1", 2, 1), ("t2", 2, 2), ("t1b", 1, 1))]
    reps = [{"id": d.id, "url": d.url, "models": [g.MODEL], "token_env": "RT", "agent": True} for d in agents]

    def conf(ports):
        # a check needs three phones ready: a loaded machine must not mark an engine down
        return ta.admin_config(ports, reps, verify=verify_conf(newcomer_rate=1.0, trust_after=100000,
                                                               budget=1.0),
                               health={"timeout_s": 5, "fall": 20})

    gw = gateway(conf, n_ports=2, env={ta.TOKEN_ENV: ta.TOKEN, "RT": llama.TOKEN},
                 ready=lambda d: (g.replicas_ready(d) or 0) >= 3)
    return gw, ta.Admin(gw)


def test_the_real_engine_with_different_thread_counts_is_never_accused(procs, gateway, tmp_path):
    """llama-server b10587 behind three agents, engines on 1, 2 and 1 threads, answering
    reviews until 100 checks were decided (half at temperature 0, whose own answers are
    compared; half sampled, each check a shadow pair at temperature 0), every answer
    checked that can be (one check of a phone at a time): they agree (a rare disagreement is settled by the fresh check that
    follows), and nobody is charged or quarantined (docs/routing.md's
    measurement)."""
    gw, admin = real_engines_checked_always(procs, gateway, tmp_path)
    # rounds of 100 reviews (half already deterministic: the caller's own answer is
    # compared; half sampled: shadow pairs) until at least 100 checks were decided, at most
    # 3,000 reviews (a loaded CI machine decided 93 in 1,000): a phone that keeps passing is
    # held ever later for its undecided check (verify.ahead x (1 + passes in a row)) and
    # answers on while one check of it runs, so how many answers could be checked depends
    # on how fast the witnesses answer
    n = 0
    for _ in range(30):
        served = send_reviews(gw, 50, start=n, workers=4, temperature=0)
        served += send_reviews(gw, 50, start=n + 50, workers=4, temperature=0.8)
        assert len(served) == 100
        n += 100
        wait_until(lambda: admin.get("/admin/v1/quarantine").json()["stats"]["checks_running"] == 0,
                   T(120), what="the checks to end")
        if admin.get("/admin/v1/quarantine").json()["stats"]["checks"] >= 100:
            break
    st = admin.get("/admin/v1/quarantine").json()
    s = st["stats"]
    assert st["quarantined"] == [] and s["quarantines"] == 0, st
    print("real engine stats:", json.dumps(s))
    assert s["checks"] >= 100, s
    # a near-tie after a cached prefix may part two engines now and then (1 in ~500 seen):
    # the fresh check that follows decides, and no honest engine is ever charged
    assert s["disagreed"] <= max(1, s["checks"] // 50) and s["votes_lost"] == 0, s
    assert all(p["strikes"] == 0 and p["votes_lost"] == 0 for p in st["phones"]), st["phones"]
    print(f"real engine, 1, 2 and 1 threads: {n} requests, {s['checks']} checks, {s['agreed']} agreed")


def test_the_real_thinking_engine_agrees_with_itself_through_capped_shadows(procs, gateway, tmp_path):
    """b10587's hybrid thinking model behind three agents on 1, 2 and 1 threads, sampled
    reviews of 200 tokens: every check's shadows stop at verify.shadow_max_tokens (128), in
    the middle of the reasoning, and agree (a near-tie may part them now and then: the fresh
    check decides); nobody is charged."""
    gw, admin = real_engines_checked_always(procs, gateway, tmp_path)
    n = 0
    for _ in range(15):  # until 30 checks were decided, at most 600 reviews
        send_reviews(gw, 40, start=n, workers=4, temperature=0.8, max_tokens=200)
        n += 40
        wait_until(lambda: admin.get("/admin/v1/quarantine").json()["stats"]["checks_running"] == 0,
                   T(120), what="the checks to end")
        if admin.get("/admin/v1/quarantine").json()["stats"]["checks"] >= 30:
            break
    st = admin.get("/admin/v1/quarantine").json()
    s = st["stats"]
    assert s["checks"] >= 30 and st["quarantined"] == [] and s["votes_lost"] == 0, st
    assert s["disagreed"] <= max(1, s["checks"] // 50), s
    shadows = [x for x in g.log_msgs(gw, "shadow request") if x["status"] == 200]
    assert shadows and {x["tokens_out"] for x in shadows} == {128}, shadows
    assert {x["tokens_out"] for x in g.log_msgs(gw, "request")} == {200}


def test_checks_still_running_do_not_hold_a_shutdown(sim, gateway):
    """A check's shadow requests have no caller: on SIGTERM they end at once (the check
    undecided, nobody charged) instead of keeping the gateway up until they are done."""
    honest = [g.phone(sim, f"slow{i}", slots=1, prefill_tps=2000, decode_tps=4, scale=1) for i in range(3)]
    gw, admin = ta.start(gateway, [g.replica(d) for d in honest],
                         verify=verify_conf(newcomer_rate=1.0, trust_after=1000))
    r = g.chat(gw, review(1), max_tokens=24, timeout=T(60), temperature=0)  # 6 s of tokens
    assert r.status_code == 200, r.text
    assert wait_until(lambda: admin.get("/admin/v1/quarantine").json()["stats"]["checks_running"] >= 1,
                      T(5)), "no check of the answer started"
    t0 = time.monotonic()
    gw.send_signal(15)
    assert gw.wait_exit(T(15)) == 0
    took = time.monotonic() - t0
    assert took < 3, f"the shutdown waited {took:.1f} s for the checks' shadow requests"
    checks = g.log_msgs(gw, "answer check", event="verify_check")
    assert checks and all(c["outcome"] == "undecided" for c in checks), checks


def test_a_quarantine_its_evidence_and_its_release_survive_restarts(sim, gateway, tmp_path):
    """With data_dir the records are kept (data_dir/verify.json): after a restart the faker
    is quarantined at once, with the same evidence and listed answers, and the honest
    phones keep the checks they passed; an operator's release is kept likewise."""
    data = tmp_path / "data"
    data.mkdir()
    honest = honest_phones(sim)
    bad = g.phone(sim, "bad", slots=2, prefill_tps=2000, decode_tps=40,
                  fault_plan=[dict(FOREVER, kind="fake")])
    reps = [g.replica(d) for d in honest + [bad]]

    def run(ready):
        return ta.start(gateway, reps, ready=ready, verify=verify_conf(), data_dir=str(data))

    gw, admin = run(4)
    served = send_reviews(gw, 60)
    assert wait_until(lambda: "bad" in quarantined(admin), T(30), what="the faker's quarantine")
    assert wait_until(lambda: admin.get("/admin/v1/quarantine").json()["stats"]["checks_running"] == 0,
               T(60), what="the checks to end")
    before = quarantined(admin)["bad"]
    answers = admin.get("/admin/v1/quarantine/bad/answers").json()
    records = {p["id"]: p for p in admin.get("/admin/v1/quarantine").json()["phones"]}
    assert any(records[f"honest{i}"]["checks_passed"] > 0 for i in range(3)), records
    gw.stop()
    assert (data / "verify.json").exists() and oct((data / "verify.json").stat().st_mode & 0o777) == "0o600"

    gw, admin = run(3)
    # quarantined before it could take a single request
    assert admin.replicas()["bad"]["state"] == "quarantined", admin.replicas()["bad"]
    after = quarantined(admin)["bad"]
    assert after["evidence"] == before["evidence"] and after["quarantined_ms"] == before["quarantined_ms"]
    assert after["strikes"] == before["strikes"], (before, after)
    again = admin.get("/admin/v1/quarantine/bad/answers").json()
    assert again["answers"] == answers["answers"], (answers, again)
    assert {rid for rid, rep in served if rep == "bad"} <= {a["request_id"] for a in again["answers"]}
    now = {p["id"]: p for p in admin.get("/admin/v1/quarantine").json()["phones"]}
    for i in range(3):
        h = f"honest{i}"
        assert now[h]["checks_passed"] >= records[h]["checks_passed"], (records[h], now[h])
        assert now[h]["strikes"] == 0 and now[h]["state"] != "quarantined", now[h]
    last = send_reviews(gw, 12, start=100)
    assert "bad" not in {rep for _, rep in last}
    # the operator's release is kept too
    assert admin.post("/admin/v1/quarantine/bad/release").status_code == 200
    gw.stop()
    gw, admin = run(4)
    assert quarantined(admin) == {}
    assert admin.replicas()["bad"]["state"] == "ready", admin.replicas()["bad"]


def test_a_damaged_records_file_is_kept_aside_and_the_gateway_starts(sim, gateway, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "verify.json").write_text('{"phones": [')
    honest = honest_phones(sim)
    gw, admin = ta.start(gateway, [g.replica(d) for d in honest], verify=verify_conf(),
                         data_dir=str(data))
    assert (data / "verify.json.damaged").read_text() == '{"phones": ['
    assert [m for m in gw.logs().splitlines() if "verify.json is damaged" in m], gw.logs()[-2000:]
    assert admin.get("/admin/v1/quarantine").json()["quarantined"] == []


def test_a_quarantine_made_by_one_gateway_holds_on_the_others_over_redis(procs, sim, gateway):
    """Two gateways on one redis-server: traffic through gw0 alone finds the faker; gw1
    quarantines it too (with gw0's evidence and listing) and sends it nothing; a release
    at gw1 puts it back to work at gw0; a gateway that joins later learns the verdicts."""
    import test_redis as tr  # noqa: PLC0415  (redis-server and the gateways' redis section)
    fleet.need_tool("redis-server", "deploy/setup.sh --test installs it")
    r = tr.start_redis(procs)
    honest = honest_phones(sim)
    bad = g.phone(sim, "bad", slots=2, prefill_tps=2000, decode_tps=40,
                  fault_plan=[dict(FOREVER, kind="fake")])
    reps = [g.replica(d) for d in honest + [bad]]

    def start(i, ready=4):
        def conf(ports):
            cfg = ta.admin_config(ports, reps, verify=verify_conf())
            cfg["redis"] = {"url": f"redis://{tr.HOST}:{r.redis_port}/0", "gateway_id": f"gw{i}",
                            "timeout_s": 0.5, "lease_ttl_s": 3, "key_env": "FG_TEST_REDIS_KEY"}
            return cfg
        d = gateway(conf, n_ports=2, name=f"gw{i}", env={**tr.GW_ENV, ta.TOKEN_ENV: ta.TOKEN},
                    ready=lambda dd: (g.replicas_ready(dd) or 0) >= ready)
        return d, ta.Admin(d)

    gw0, a0 = start(0)
    gw1, a1 = start(1)
    assert wait_until(lambda: tr.rcli(r.redis_port, "ZCARD", "fleetgate:gateways") == "2", T(10),
               what="both gateways in redis")
    # twice the honest phones' 6 slots at once (the heartbeat test says why): with 4, a
    # loaded sanitizer CI run gave the honest phones records first and the faker 2 answers
    served = send_reviews(gw0, 60, workers=12)
    assert wait_until(lambda: "bad" in quarantined(a0), T(30), what="the faker's quarantine at gw0")
    assert wait_until(lambda: "bad" in quarantined(a1), T(10), what="gw0's quarantine at gw1")
    q0, q1 = quarantined(a0)["bad"], quarantined(a1)["bad"]
    assert q1["evidence"] == q0["evidence"] and q1["quarantined_ms"] == q0["quarantined_ms"], (q0, q1)
    assert q1["quarantined_by_gateway"] == "gw0" and q0["quarantined_by_gateway"] is None, (q0, q1)
    assert a1.replicas()["bad"]["state"] == "quarantined"
    listed = {a["request_id"] for a in a1.get("/admin/v1/quarantine/bad/answers").json()["answers"]}
    assert {rid for rid, rep in served if rep == "bad"} <= listed
    # gw1 sends it nothing, though gw1 itself never checked it
    assert "bad" not in {rep for _, rep in send_reviews(gw1, 16, start=200)}
    assert a1.metrics()["fleetgate_verify_quarantines_total"] == 0  # decided at gw0
    # a third gateway that starts now learns it from Redis
    gw2, a2 = start(2, ready=3)
    assert wait_until(lambda: "bad" in quarantined(a2), T(10), what="the quarantine at a new gateway")
    # the operator releases it at gw1: gw0 and gw2 put it back to work
    assert a1.post("/admin/v1/quarantine/bad/release").status_code == 200
    for a in (a0, a2):
        assert wait_until(lambda a=a: a.replicas()["bad"]["state"] == "ready", T(10), what="the release elsewhere")
        assert quarantined(a) == {}
    # honest phones were quarantined nowhere
    for a in (a0, a1, a2):
        assert all(not rep["quarantined"] for rep in a.replicas().values())
