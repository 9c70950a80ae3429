"""Callers against each other through the phones' prompt caches (docs/security.md,
"Tenants' prompts"). A caller who guesses another key's prompt learns whether a phone had
cached it from the answer's `cached_tokens` / `timings.cache_n`, and from how fast the
answer comes. With the default scopes (each key its own) the right and the wrong guess
look alike; a key that shares the victim's `cache_scope` still gets the victim's cache.

Phones whose agent keeps scopes apart (the sim, `fleetgate-agent --engine llama`) decide
each reuse themselves (agent/isolate.c); the gateway keeps any other phone apart as a
whole (gateway/pcache.c) and remembers it across restarts (data_dir). The attacks of a
review of the first design are here too, against the real 2026 llama-server behind the
agent: a guess made to look like the attacker's own slot with tools the gateway does not
fingerprint, a request the engine refuses, a stalled engine, a slot count set above the
engine's, `n_cmpl`. Across gateways over Redis: test_redis.py."""
import hashlib
import os
import signal
import statistics
import time

import requests

import fleet
import gwutil as g
import llama
from fleet import T

ADMIN_TOKEN = "cache-test-admin-token-0123"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
NOTHINK = {"enable_thinking": False}

# The secret the victim's prompt carries, and the attacker's two guesses: the same length,
# the same long tail, differing in one word near the start.
PAD = fleet.make_prompt(600, tag="tail")
SECRET = "Patient record: diagnosis=HIV-positive; " + PAD
WRONG = "Patient record: diagnosis=HIV-negative; " + PAD
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "d",
                                            "parameters": {"type": "object", "properties": {}}}}]


def key(name, scope=None):
    k = {"name": name, "key_sha256": hashlib.sha256(name.encode()).hexdigest()}
    if scope:
        k["cache_scope"] = scope
    return k


KEYS = [key("victim-key", scope="clinic"), key("colleague-key", scope="clinic"),
        key("attacker-key")]


def auth(name):
    return {"Authorization": f"Bearer {name}"}


def cached_of(body):
    """Prompt tokens the phone reused: cached_tokens, or (the 2025 engine, which reports
    none) prompt_tokens less what it evaluated."""
    d = body["usage"].get("prompt_tokens_details")
    if d and "cached_tokens" in d:
        return d["cached_tokens"]
    return body["usage"]["prompt_tokens"] - body["timings"]["prompt_n"]


def ask(gw, who, content, **kw):
    t0 = time.monotonic()
    r = g.chat(gw, content=content, max_tokens=2, headers=auth(who), timeout=T(60), **kw)
    took = time.monotonic() - t0
    assert r.status_code == 200, r.text[:400]
    body = r.json()
    return cached_of(body), body.get("timings", {}).get("cache_n", 0), took


def start(gateway, replicas, admin_port=True, env=None, **top):
    def cfg(ports):
        c = g.gw_config(ports[0], replicas, api_keys=KEYS, **top)
        if admin_port:
            c["admin"] = {"listen": f"{fleet.HOST}:{ports[1]}", "token": ADMIN_TOKEN}
        return c

    return gateway(cfg, n_ports=2, env=env, ready=lambda d: (g.replicas_ready(d) or 0) >= len(replicas))


def admin(gw, path):
    r = requests.get(f"http://{fleet.HOST}:{gw.ports[1]}{path}", headers=ADMIN, timeout=T(5))
    assert r.status_code == 200, r.text
    return r


def holder(gw):
    return {x["id"]: (x["prompt_cache"], x["cache_isolation"])
            for x in admin(gw, "/admin/v1/replicas").json()["replicas"]}


def sim_phone(sim, slots=1):
    """600 tokens take it 0.3 s uncached."""
    return g.phone(sim, "p0", slots=slots, prefill_tps=200, decode_tps=50)


def sim_replica(p):
    """Its agent's status says how it keeps scopes apart: checked as an agent's (a phone
    registered by heartbeat is one too)."""
    return g.replica(p, agent=True)


def guesses(gw, n=20):
    """The attacker alternates the right and the wrong guess n times each: what it sees."""
    right, wrong = [], []
    for _ in range(n):
        right.append(ask(gw, "attacker-key", SECRET))
        wrong.append(ask(gw, "attacker-key", WRONG))
    return right, wrong


def alike(right, wrong, victims_cached):
    """The right and the wrong guess give the same fields (what the attacker's own earlier
    guess left: the two share only their first words) and the same time."""
    rc, wc = [c for c, _, _ in right], [c for c, _, _ in wrong]
    assert max(rc + wc) < victims_cached / 4, (rc, wc)
    assert sorted(set(rc[1:])) == sorted(set(wc)), (rc, wc)
    tr, tw = [t for _, _, t in right], [t for _, _, t in wrong]
    mr, mw = statistics.median(tr), statistics.median(tw)
    assert abs(mr - mw) < 0.15 * max(mr, mw), (mr, mw, tr, tw)
    return mr, mw


def test_cache_oracle_gives_no_signal_between_keys(sim, gateway):
    """The victim's prompt is cached on the only phone. Its colleague (same cache_scope)
    reuses it: the oracle works within a scope. The attacker's right and wrong guesses,
    20 of each, alternating: no answer shows the victim's prompt cached, the two kinds of
    guess show the same fields and take the same time."""
    p = sim_phone(sim)
    gw = start(gateway, [sim_replica(p)])
    assert holder(gw)["p0"] == ("its agent's, slot by slot", "agent")
    assert ask(gw, "colleague-key", WRONG)[0] == 0
    assert ask(gw, "victim-key", SECRET)[0] < 50  # the colleague's prompt shares a few words
    warm = ask(gw, "victim-key", SECRET)
    assert warm[0] > 500, warm  # the phone has it, and the victim reuses it
    col = ask(gw, "colleague-key", SECRET)  # the oracle within one scope: it works
    assert col[0] > 500 and col[1] > 500, col

    right, wrong = guesses(gw)
    mr, mw = alike(right, wrong, warm[0])
    # uncached, both guesses read the whole prompt: slower than the colleague's hit
    assert min(mr, mw) > col[2], (mr, mw, col)
    assert holder(gw)["p0"] == ("its agent's, slot by slot", "agent")
    m = fleet.parse_prometheus(admin(gw, "/metrics").text)
    assert m["fleetgate_cache_isolated_total"] == 0  # the phone's agent decided, not the gateway
    # the victim, too, reads uncached now: the slot holds the attacker's prompt
    assert ask(gw, "victim-key", SECRET)[0] == 0


def test_two_scopes_keep_their_own_slots_warm_on_one_phone(sim, gateway):
    """On a phone with two slots the agent gives each scope its own: the victim and the
    attacker each keep a slot warm with their own prompts and reuse it, and neither reuses
    the other's."""
    p = sim_phone(sim, slots=2)
    gw = start(gateway, [sim_replica(p)])
    mine = fleet.make_prompt(600, tag="attackers-own")
    ask(gw, "victim-key", SECRET)
    ask(gw, "attacker-key", mine)
    for _ in range(3):
        assert ask(gw, "victim-key", SECRET)[0] > 500
        assert ask(gw, "attacker-key", mine)[0] > 500
    assert ask(gw, "attacker-key", SECRET)[0] < 50
    assert ask(gw, "victim-key", SECRET)[0] > 500  # the attacker rewrote its own slot


def test_a_single_scope_shares_as_before(sim, gateway):
    """An open gateway (no keys) is one scope: a repeated prompt is served warm, as it
    always was."""
    p = sim_phone(sim)
    gw = g.start_gateway(gateway, [g.replica(p)])
    assert cached_of(g.check_chat_ok(g.chat(gw, content=SECRET, max_tokens=2))) == 0
    assert cached_of(g.check_chat_ok(g.chat(gw, content=SECRET, max_tokens=2))) > 500


def bare_engine(procs, tmp_path, release, slots=1):
    e = llama.prepare(tmp_path / f"engine-{release}", release=release)
    return llama.start(procs, e, slots=slots, alias=g.MODEL, ctx_per_slot=4096)


def bare_replica(d, id="bare"):
    return {"id": id, "url": d.url, "models": [g.MODEL]}


def test_a_bare_engine_is_kept_apart_as_a_whole_across_restarts(procs, gateway, tmp_path):
    """A bare llama-server (the 2025 build, no agent) is kept apart by the gateway as a
    whole. Ready before the gateway started, it may hold anyone's prompts: nobody reuses
    it, and data_dir remembers so across a restart of the gateway; without that memory it
    is unknown again. (Seen loading its model, an engine holds nothing: tests/unit/
    test_pcache.c, docs/security.md.)"""
    d = bare_engine(procs, tmp_path, "2025")
    data = tmp_path / "data"
    data.mkdir()
    gw = start(gateway, [bare_replica(d)], data_dir=str(data))
    assert holder(gw)["bare"] == ("unknown", "gateway")
    assert ask(gw, "victim-key", SECRET)[0] < 50
    assert ask(gw, "victim-key", SECRET)[0] < 50  # unknown: nobody reuses, not even the victim
    assert fleet.parse_prometheus(admin(gw, "/metrics").text)["fleetgate_cache_isolated_total"] == 2
    gw.stop()
    assert "bare *\n" in (data / "cache-scopes.log").read_text()
    gw = start(gateway, [bare_replica(d)], data_dir=str(data))
    assert holder(gw)["bare"] == ("several", "gateway")
    assert ask(gw, "attacker-key", SECRET)[0] < 50
    gw.stop()
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    gw = start(gateway, [bare_replica(d)], data_dir=str(fresh))
    assert holder(gw)["bare"] == ("unknown", "gateway")


def agent_2026(procs, tmp_path, id="a", slots=2, **kw):
    e = llama.prepare(tmp_path / f"engine-{id}", release="2026")
    return llama.start_agent(procs, e, tmp_path, id, slots=slots, alias=g.MODEL,
                             ctx_per_slot=4096, **kw)


def agent_replica(d):
    return {"id": d.id, "url": d.url, "models": [g.MODEL], "token_env": "RT", "agent": True}


def via(gw, who, content=None, ok=True, **kw):
    body = {"model": g.MODEL, "max_tokens": 1, "chat_template_kwargs": NOTHINK,
            "messages": [{"role": "user", "content": content}]}
    body.update(kw)
    r = gw.post(g.CHAT, json=body, headers=auth(who), timeout=T(60))
    if not ok:
        return r.status_code
    assert r.status_code == 200, r.text[:400]
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_the_2026_engine_behind_the_agent(procs, gateway, tmp_path):
    """llama-server b10587 keeps every prompt it read in a RAM cache and restores the best
    match from it, anyone's, in several cases (a named slot that would lose most of what it
    holds, a new prompt sharing little with it, a busy slot). The agent starts it with
    --cache-ram 0 and names the slots itself: the review's attacks give nothing."""
    d = agent_2026(procs, tmp_path)
    st = llama.status(d)
    assert st["cache_isolation"] == "slots", st
    gw = start(gateway, [agent_replica(d)], env={"RT": llama.TOKEN})
    assert via(gw, "victim-key", SECRET) == 0
    warm = via(gw, "victim-key", SECRET)
    assert warm > 500, warm
    via(gw, "attacker-key", fleet.make_prompt(300, tag="mine"))  # the attacker's own slot

    def probe(guess, trick):
        trick(guess)
        return via(gw, "attacker-key", guess)

    tricks = {
        # tools the template puts before the messages: the guess with them, then without
        "tools": lambda guess: via(gw, "attacker-key", guess, tools=TOOLS),
        # a request the engine refuses outright, then the same guess
        "refused": lambda guess: via(gw, "attacker-key", guess, ok=False, tool_choice="bogus"),
        # a prompt sharing only its first words, then the guess (the engine would look in
        # its RAM cache for a better one)
        "little": lambda guess: via(gw, "attacker-key", guess[:239] + " zz"),
    }
    for name, trick in tricks.items():
        right, wrong = probe(SECRET, trick), probe(WRONG, trick)
        assert right < warm / 4 and wrong < warm / 4 and abs(right - wrong) < 50, (name, right, wrong)
    # n_cmpl, llama-server's own name for n, would run a second completion on another slot
    r = gw.post(g.CHAT, json={"model": g.MODEL, "max_tokens": 1, "n_cmpl": 2,
                              "messages": [{"role": "user", "content": "hi"}]},
                headers=auth("attacker-key"), timeout=T(30))
    assert r.status_code == 400 and r.json()["error"]["param"] == "n_cmpl", r.text
    # the victim's own slot is still warm: the attacks never touched it
    assert via(gw, "victim-key", SECRET) > 500


def test_a_refused_request_does_not_make_the_slot_the_callers(procs, gateway, tmp_path):
    """One slot, the victim's prompt in it. The attacker's guess is refused by the engine
    outright (a tool_choice it cannot read: 400) and never touched the slot; the agent does
    not count the slot as the attacker's for it, so the guess sent again reuses nothing."""
    d = agent_2026(procs, tmp_path, slots=1)
    gw = start(gateway, [agent_replica(d)], env={"RT": llama.TOKEN})
    via(gw, "victim-key", SECRET)
    assert via(gw, "victim-key", SECRET) > 500
    seen = {}
    for guess in (SECRET, WRONG):
        assert via(gw, "attacker-key", guess, ok=False, tool_choice="bogus") == 400
        seen[guess] = via(gw, "attacker-key", guess)
        via(gw, "victim-key", SECRET)  # the victim's prompt back in the slot
    assert seen[SECRET] == 0 and seen[WRONG] == 0, seen


def test_a_stalled_engine_is_not_a_new_one(procs, gateway, tmp_path):
    """An engine that stops answering for a while (SIGSTOP) is "loading" to the agent and
    the gateway; it is the same process, holding the victim's prompt: the attacker's first
    guess afterwards reuses nothing."""
    d = agent_2026(procs, tmp_path, slots=1)
    gw = start(gateway, [agent_replica(d)], env={"RT": llama.TOKEN})
    via(gw, "victim-key", SECRET)
    assert via(gw, "victim-key", SECRET) > 500
    pid = llama.status(d)["engine_pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        fleet.wait_until(lambda: llama.status(d)["engine_state"] == "loading", T(15),
                         what="the agent calls the stalled engine loading")
        time.sleep(1.5)  # the gateway's checks see it
    finally:
        os.kill(pid, signal.SIGCONT)
    fleet.wait_until(lambda: (g.replicas_ready(gw) or 0) >= 1, T(20), what="ready again")
    assert llama.status(d)["engine_pid"] == pid
    assert via(gw, "attacker-key", SECRET) == 0


def test_requests_beyond_the_engines_slots(procs, gateway, tmp_path):
    """The gateway may send a phone more requests than its engine has slots (a replica file
    saying more; several gateways). The agent names only the engine's own slots (b10587
    takes an id past them modulo their count); a request that must wait for a busy slot
    reuses nothing. The attacker keeps the one slot busy and guesses meanwhile."""
    import threading
    d = agent_2026(procs, tmp_path, slots=1)
    gw = start(gateway, [dict(agent_replica(d), slots=3)], env={"RT": llama.TOKEN})
    via(gw, "victim-key", SECRET)
    assert via(gw, "victim-key", SECRET) > 500
    out = {}

    def busy():
        out["long"] = via(gw, "attacker-key", fleet.make_prompt(300, tag="long"), max_tokens=3000)

    for guess in (SECRET, WRONG):
        t = threading.Thread(target=busy)
        t.start()
        time.sleep(0.3)
        out[guess] = via(gw, "attacker-key", guess)
        t.join()
    assert out[SECRET] == 0 and out[WRONG] == 0, out


def test_the_2026_engine_bare_is_kept_apart_as_a_whole(procs, gateway, tmp_path):
    """Bare (no agent), the 2026 engine's RAM cache is there: the gateway keeps the engine
    apart as a whole, so a phone it knows nothing of is reused by nobody, and the secret
    the engine holds (it restores it for a request straight to it) is no oracle."""
    d = bare_engine(procs, tmp_path, "2026")

    def direct(content):
        body = fleet.chat_body(content, model=g.MODEL, max_tokens=2, id_slot=0,
                               chat_template_kwargs=NOTHINK)
        r = requests.post(d.url + "/v1/chat/completions", json=body, timeout=T(30))
        assert r.status_code == 200, r.text
        return r.json()["timings"]["cache_n"]

    other = fleet.make_prompt(500, tag="invoice")
    gw = start(gateway, [bare_replica(d)])
    via(gw, "victim-key", SECRET)
    via(gw, "victim-key", other)
    assert direct(SECRET) > 500  # the engine has it, straight to it
    assert via(gw, "attacker-key", SECRET) == 0
    assert via(gw, "attacker-key", WRONG) == 0
    assert holder(gw)["bare"][1] == "gateway"
