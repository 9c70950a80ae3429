"""Several choices ("n" > 1): a request of n choices goes to a phone whose engine writes n at
once, and holds n of its slots while it runs (docs/routing.md "Several choices"); what no
phone writes is refused up front, what one could is never refused. With sims: b10587's
(the default), the 2025 build's (--sim-release 2025, which refuses "n" > 1 with a 500). The
same against the real engines: test_llama.py."""

import concurrent.futures
import time

import fleet
import gwutil as g
from fleet import T, wait_until
from gwutil import MODEL
from test_admin import start as start_admin


def body(n, max_tokens=8, **kw):
    b = fleet.chat_body("several answers", model=MODEL, max_tokens=max_tokens, **kw)
    b["n"] = n
    return b


def test_choices_take_that_many_slots_of_a_phone_that_writes_them(sim, gateway):
    # the agent keeps callers apart by the whole engine here (a RAM cache: --cache-ram), so
    # it serves several choices; a 2025 engine beside it serves one
    new = g.phone(sim, "new", slots=4, decode_tps=4, extra_args=["--cache-ram", "100000"])
    old = g.phone(sim, "old", slots=4, decode_tps=4, extra_args=["--sim-release", "2025"])
    d, adm = start_admin(gateway, [g.replica(new), g.replica(old)])
    assert wait_until(lambda: all(x["engine_features"] for x in adm.replicas().values()), T(10)), adm.replicas()
    reps = adm.replicas()
    assert reps["new"]["engine_features"]["choices"] == 4, reps["new"]
    assert reps["old"]["engine_features"]["choices"] == 1, reps["old"]

    # three choices take three of new's four slots for as long as they run (40 tokens at 40/s)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as ex:
        f = ex.submit(lambda: d.post(g.CHAT, json=body(3, max_tokens=40), timeout=T(30)))
        busy = wait_until(lambda: adm.replicas()["new"]["slots_busy"] == 3, T(5), interval=0.05)
        assert busy, adm.replicas()["new"]
        # one choice beside it is served meanwhile (the fourth slot, or the old phone)
        one = d.post(g.CHAT, json=body(1), timeout=T(30))
        assert one.status_code == 200, one.text
        r = f.result()
    assert r.status_code == 200, r.text
    assert r.headers["x-fleetgate-replica"] == "new", r.headers
    got = r.json()
    assert sorted(c["index"] for c in got["choices"]) == [0, 1, 2], got
    assert wait_until(lambda: adm.replicas()["new"]["slots_busy"] == 0, T(5)), adm.replicas()["new"]

    # streamed: every choice's chunks, one [DONE]
    r = d.post(g.CHAT, json=body(2, stream=True), stream=True, timeout=T(30))
    assert r.status_code == 200, r.text
    assert r.headers["x-fleetgate-replica"] == "new", r.headers
    res = fleet.read_sse(r, timeout=T(30))
    assert res.done, res.data[-3:]
    assert {c["index"] for e in res.chunks() for c in e.get("choices", [])} == {0, 1}, res.data

    # more than any phone writes: refused before any phone is used, as the request's fault
    e = g.check_error(d.post(g.CHAT, json=body(5), timeout=T(10)), 400, code="unsupported_value")
    assert e["param"] == "n" and "more than 4 choices" in e["message"], e
    reps = adm.replicas()
    assert all(x["state"] in ("ready", "busy") and x["failures"] == 0 for x in reps.values()), reps  # busy: not charged


def test_choices_no_phone_writes_are_refused_once_the_phones_are_known(sim, gateway):
    """A fleet of 2025 engines only: "n": 2 is refused (400) with what the fleet writes, not
    sent to a phone that would answer it with a 500; one choice goes on as ever."""
    old = g.phone(sim, "old", slots=2, extra_args=["--sim-release", "2025"])
    d, adm = start_admin(gateway, [g.replica(old)])
    t0 = time.monotonic()
    e = g.check_error(d.post(g.CHAT, json=body(2), timeout=T(10)), 400, code="unsupported_value")
    assert time.monotonic() - t0 < T(5)
    assert e["param"] == "n" and "more than 1 choice " in e["message"], e
    nc = body(1)
    del nc["n"]
    nc["n_cmpl"] = 2  # llama-server's own name for it
    e = g.check_error(d.post(g.CHAT, json=nc, timeout=T(10)), 400, code="unsupported_value")
    assert e["param"] == "n_cmpl", e
    assert d.post(g.CHAT, json=body(1), timeout=T(10)).status_code == 200
    assert adm.replicas()["old"]["failures"] == 0
