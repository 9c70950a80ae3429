"""Callers against each other through the phones' prompt caches (docs/security.md,
"Tenants' prompts"). A caller who guesses another key's prompt learns whether a phone had
it cached from the answer's `cached_tokens` / `timings.cache_n`, and from how fast the
answer comes: with the default scopes (each key its own) both guesses look the same; a
key that shares the victim's `cache_scope` still gets the victim's cache, as before. The
gateway keeps what each phone's engine may hold across a restart (data_dir), and gateways
sharing Redis decide it together (test_redis.py)."""
import hashlib
import shutil
import statistics
import time

import requests

import fleet
import gwutil as g
import llama
from fleet import T

ADMIN_TOKEN = "cache-test-admin-token-0123"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

# The secret the victim's prompt carries, and the attacker's two guesses: the same length,
# the same long tail, differing in one word near the start.
PAD = fleet.make_prompt(600, tag="tail")
SECRET = "Patient record: diagnosis=HIV-positive; " + PAD
WRONG = "Patient record: diagnosis=HIV-negative; " + PAD


def key(name, scope=None):
    k = {"name": name, "key_sha256": hashlib.sha256(name.encode()).hexdigest()}
    if scope:
        k["cache_scope"] = scope
    return k


def auth(name):
    return {"Authorization": f"Bearer {name}"}


def ask(gw, who, content):
    t0 = time.monotonic()
    r = g.chat(gw, content=content, max_tokens=2, headers=auth(who), timeout=T(30))
    took = time.monotonic() - t0
    body = g.check_chat_ok(r)
    cached = body["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
    return cached, body.get("timings", {}).get("cache_n", 0), took


def start(gateway, phones, admin_port=True, **top):
    keys = [key("victim-key", scope="clinic"), key("colleague-key", scope="clinic"),
            key("attacker-key")]

    def cfg(ports):
        c = g.gw_config(ports[0], [g.replica(p) for p in phones], api_keys=keys, **top)
        if admin_port:
            c["admin"] = {"listen": f"{fleet.HOST}:{ports[1]}", "token": ADMIN_TOKEN}
        return c

    return gateway(cfg, n_ports=2, ready=lambda d: (g.replicas_ready(d) or 0) >= len(phones))


def loading_phone(sim):
    """A phone whose engine is seen loading its model when the gateway starts (1.5 s): the
    gateway knows its cache is empty. 600 tokens take it 0.3 s uncached."""
    return g.phone(sim, "p0", prefill_tps=200, decode_tps=50, loading_s=15)


def holder(gw):
    r = requests.get(f"http://{fleet.HOST}:{gw.ports[1]}/admin/v1/replicas", headers=ADMIN,
                     timeout=T(5))
    assert r.status_code == 200, r.text
    return {x["id"]: x["prompt_cache"] for x in r.json()["replicas"]}


def test_cache_oracle_gives_no_signal_between_keys(sim, gateway):
    """The victim's prompt is cached on the only phone. Its colleague (same cache_scope)
    reuses it: the oracle works within a scope. The attacker's right and wrong guesses,
    20 of each, alternating: no cached tokens in any answer and the same time to answer."""
    p = loading_phone(sim)
    gw = start(gateway, [p])
    first = ask(gw, "victim-key", SECRET)
    assert first[0] == 0, first
    warm = ask(gw, "victim-key", SECRET)
    assert warm[0] > 500, warm  # the phone has it, and the victim reuses it
    assert holder(gw)["p0"] == "clinic"
    # the colleague shares the scope: the cache is there for it, and it is fast
    col = ask(gw, "colleague-key", SECRET)
    assert col[0] > 500 and col[1] > 500, col
    col_wrong = ask(gw, "colleague-key", WRONG)
    assert col_wrong[0] < 50, col_wrong

    right, wrong = [], []
    for _ in range(20):
        right.append(ask(gw, "attacker-key", SECRET))
        wrong.append(ask(gw, "attacker-key", WRONG))
    assert all(c == 0 and n == 0 for c, n, _ in right + wrong), (right, wrong)
    tr = [t for _, _, t in right]
    tw = [t for _, _, t in wrong]
    mr, mw = statistics.median(tr), statistics.median(tw)
    # uncached, both guesses read the whole prompt: the colleague's hit was much faster
    assert min(mr, mw) > col[2] * 1.5 or min(mr, mw) > 0.2, (mr, mw, col)
    assert abs(mr - mw) < 0.15 * max(mr, mw), (mr, mw, tr, tw)
    assert holder(gw)["p0"] == "several"
    m = requests.get(f"http://{fleet.HOST}:{gw.ports[1]}/metrics", headers=ADMIN, timeout=T(5))
    # the attacker's 40 guesses went uncached, and the colleague's wrong one (its slot's
    # prefix kept too little of what the slot held: the engine would have searched its
    # other cached prompts)
    assert fleet.parse_prometheus(m.text)["fleetgate_cache_isolated_total"] == 41
    # the victim, too, reads uncached now: the phone may hold the attacker's prompts
    after = ask(gw, "victim-key", SECRET)
    assert after[0] == 0, after


def test_two_scopes_keep_their_own_slots_warm_on_one_phone(sim, gateway):
    """The gateway names the slot each request takes: on a phone with two slots, the
    victim and the attacker each keep a slot warm with their own prompts and reuse them,
    and neither reuses the other's."""
    p = g.phone(sim, "p0", slots=2, prefill_tps=200, decode_tps=50, loading_s=15)
    gw = start(gateway, [p])
    mine = fleet.make_prompt(600, tag="attackers-own")
    ask(gw, "victim-key", SECRET)
    ask(gw, "attacker-key", mine)
    for _ in range(3):
        assert ask(gw, "victim-key", SECRET)[0] > 500
        assert ask(gw, "attacker-key", mine)[0] > 500
    assert ask(gw, "attacker-key", SECRET)[0] == 0
    assert ask(gw, "victim-key", SECRET)[0] > 500  # the attacker rewrote its own slot
    assert holder(gw)["p0"] == "several"


def test_phone_holding_one_scope_keeps_it_across_a_restart(sim, gateway, tmp_path):
    """data_dir keeps what each phone's engine may hold: after a restart the victim's phone
    still serves it warm and the attacker cold; a gateway without that memory takes the
    phone's cache as unknown (nobody reuses it) until the engine loads again."""
    data = tmp_path / "data"
    data.mkdir()
    p = loading_phone(sim)
    gw = start(gateway, [p], data_dir=str(data))
    ask(gw, "victim-key", SECRET)
    assert ask(gw, "victim-key", SECRET)[0] > 500
    gw.stop()
    assert "p0 " in (data / "cache-scopes.log").read_text()
    gw = start(gateway, [p], data_dir=str(data))
    assert holder(gw)["p0"] == "clinic"
    assert ask(gw, "victim-key", SECRET)[0] > 500
    assert ask(gw, "attacker-key", SECRET)[0] == 0
    gw.stop()
    # no memory of it: unknown, reused by nobody until the gateway's own request rewrites
    # the slot (it names the slot: the phone's engine is a llama-server, the sim)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    gw = start(gateway, [p], data_dir=str(fresh))
    assert holder(gw)["p0"] == "unknown"
    assert ask(gw, "attacker-key", SECRET)[0] == 0
    assert ask(gw, "attacker-key", SECRET)[0] > 500  # its own prompt, now


def test_a_single_scope_shares_as_before(sim, gateway):
    """An open gateway (no keys) is one scope: a repeated prompt is served warm, as it
    always was, and the phone shows it holds everyone's."""
    p = g.phone(sim, "p0", prefill_tps=200, decode_tps=50)
    gw = g.start_gateway(gateway, [g.replica(p)])
    assert g.check_chat_ok(g.chat(gw, content=SECRET, max_tokens=2))["usage"].get(
        "prompt_tokens_details", {}).get("cached_tokens", 0) == 0
    b = g.check_chat_ok(g.chat(gw, content=SECRET, max_tokens=2))
    assert b["usage"]["prompt_tokens_details"]["cached_tokens"] > 500, b


def qwen35_engine(tmp_path):
    """The 2026 llama-server (b10587) and its tiny qwen35 model, copied for this test (CI
    has shared/ beside the clone; a missing engine fails under CI=true)."""
    src = fleet.SOURCE_ROOT.parent / "shared/engines/llama-server-qwen35"
    if not (src / "llama-server").is_file():
        fleet.need_tool(str(src / "llama-server"), "the 2026 llama-server lives in shared/engines",
                        found=False)
    e = llama.Engine(tmp_path / "qwen35")
    e.folder.mkdir(parents=True, exist_ok=True)
    e.model = e.folder / "tiny-qwen35.gguf"
    shutil.copyfile(src / "llama-server", e.bin)
    shutil.copyfile(src / "tiny-qwen35.gguf", e.model)
    e.bin.chmod(0o755)
    return e


def test_the_engines_ram_cache_is_no_way_around(procs, gateway, tmp_path):
    """llama-server b10587 keeps every prompt it read in a RAM cache, and restores the best
    match from it, anyone's, when a request pinned to a slot would make the slot lose more
    than half of what it holds. Straight to the engine that is an oracle; through the
    gateway the attacker's guess reuses nothing, while the victim's prompt is in the RAM
    cache (the engine restores it for a direct request just before)."""
    e = qwen35_engine(tmp_path)
    d = llama.start(procs, e, slots=1, alias=g.MODEL, ctx_per_slot=4096)
    other = fleet.make_prompt(500, tag="invoice")

    def direct(content, slot=0):
        body = fleet.chat_body(content, model=g.MODEL, max_tokens=2, id_slot=slot,
                               chat_template_kwargs={"enable_thinking": False})
        r = requests.post(d.url + "/v1/chat/completions", json=body, timeout=T(30))
        assert r.status_code == 200, r.text
        return r.json()["timings"]["cache_n"]

    # the leak, straight to the engine
    direct(SECRET)
    direct(other)
    assert direct(SECRET) > 500
    direct(other)

    keys = [key("victim-key", scope="clinic"), key("attacker-key")]
    gw = gateway(lambda ports: g.gw_config(ports[0], [{"id": "q35", "url": d.url, "models": [g.MODEL]}],
                                           api_keys=keys),
                 ready=lambda gd: (g.replicas_ready(gd) or 0) >= 1)

    def via(who, content):
        r = g.chat(gw, content=content, max_tokens=2, headers=auth(who), timeout=T(30),
                   chat_template_kwargs={"enable_thinking": False})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    via("victim-key", SECRET)
    via("victim-key", other)        # the secret goes to the RAM cache...
    assert direct(SECRET) > 500     # ...where a request that may reuse finds it
    assert via("attacker-key", SECRET) == 0
    assert via("attacker-key", WRONG) == 0
    # the slot holds the attacker's own prompt: its guess may not reuse even that, since
    # it keeps less than half of it and the engine would search its RAM cache
    via("attacker-key", fleet.make_prompt(500, tag="mine"))
    assert via("attacker-key", SECRET) == 0
