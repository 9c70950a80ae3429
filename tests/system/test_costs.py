"""System tests of the cost accounting (issue 19, part 4): two sim phones with known
`cost_per_day` and slots, a known number of requests from two API keys, and the cost per
1,000 requests and per million tokens that /admin/v1/costs and /metrics give, per model,
per key and for the fleet, checked against the test's own computation; a phone's price
from its heartbeats (`fleetgate-agent --cost-per-day`), capped, and never over a
replica file's.

The arithmetic (docs/operations.md "Costs"): a replica costs cost_per_day / 86400 per
second it is in the registry; a request is charged the seconds it held a slot there at
cost_per_day / slots / 86400 a second."""

import hashlib
import time

import requests

import fleet
import gwutil as g
from fleet import HOST, T

ADMIN_TOKEN = "cost-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
KEYS = {"alpha": "sk-alpha-0123456789abcdef", "beta": "sk-beta-0123456789abcdef"}
DAY = 86400.0
SECRET = "cost-fleet-secret-0123456789"


def close(got, want, rel=1e-6, what=""):
    assert abs(got - want) <= rel * abs(want) + 1e-15, f"{what}: got {got!r}, want {want!r}"


def admin_get(d, path):
    r = requests.get(f"http://{HOST}:{d.ports[1]}{path}", headers=AUTH, timeout=T(10))
    assert r.status_code == 200, r.text
    return r


def test_costs_per_model_key_and_fleet_agree_with_the_requests(sim, gateway):
    # phone A: 0.57 a day over 2 slots; phone B: 1.03 a day, 1 slot (the seed's figures)
    pa = g.phone(sim, "pa", slots=2, model="m-a", decode_tps=10)
    pb = g.phone(sim, "pb", slots=1, model="m-b", decode_tps=10)
    price = {"m-a": 0.57 / 2 / DAY, "m-b": 1.03 / 1 / DAY}  # a slot-second on each phone
    keys = [{"name": n, "key_sha256": hashlib.sha256(k.encode()).hexdigest()} for n, k in KEYS.items()]
    reps = [g.replica(pa, cost_per_day=0.57), g.replica(pb, cost_per_day=1.03)]

    def config(ports):
        cfg = g.gw_config(ports[0], reps, api_keys=keys, costs={"currency": "EUR"})
        cfg["admin"] = {"listen": f"{HOST}:{ports[1]}", "token": ADMIN_TOKEN}
        return cfg
    t_start = time.monotonic()
    d = gateway(config, n_ports=2, ready=lambda d: (g.replicas_ready(d) or 0) >= 2)

    # (key, model, max_tokens): 4 requests on A, 2 on B, one after the other so that the
    # slot time of each lies inside the time the test measured for it
    plan = [("alpha", "m-a", 30), ("alpha", "m-a", 20), ("alpha", "m-a", 40),
            ("beta", "m-a", 30), ("beta", "m-b", 25), ("beta", "m-b", 35)]
    done = []
    for key, model, n in plan:
        t0 = time.monotonic()
        r = g.chat(d, model=model, max_tokens=n, headers={"Authorization": f"Bearer {KEYS[key]}"})
        took = time.monotonic() - t0
        body = g.check_chat_ok(r)
        u = body["usage"]
        assert u["completion_tokens"] == n, u
        # the sim generates n tokens at 10 x 10 a second: the least time a slot was held
        done.append({"key": key, "model": model, "took": took, "gen": n / (10 * g.SCALE),
                     "tokens": u["prompt_tokens"] + u["completion_tokens"]})

    c = admin_get(d, "/admin/v1/costs").json()
    assert c["currency"] == "EUR" and c["cost_per_day"] == 1.6, c
    h = c["hour"]
    # the window: since the gateway started (it is younger than an hour)
    assert 0 < h["window_s"] <= time.monotonic() - t_start + 1, h["window_s"]
    f = h["fleet"]
    # the fleet costs 1.6 a day for every second of the window, whatever it did
    close(f["cost"], 1.6 * h["window_s"] / DAY, 1e-4, "fleet cost")
    close(f["idle_cost"], f["cost"] - f["busy_cost"], 1e-9, "idle = cost - busy")
    assert f["requests"] == 6 and f["tokens"] == sum(x["tokens"] for x in done), f
    close(f["cost_per_1k_requests"], f["cost"] / 6 * 1000, 1e-9, "fleet per 1k requests")
    close(f["cost_per_million_tokens"], f["cost"] / f["tokens"] * 1e6, 1e-9, "fleet per 1M tokens")

    def expect(rows):
        """The hand computation: each request's slot time at its phone's price. The slot is
        held from when the request goes to the phone until its answer ends: no less than the
        sim's generation time, no more than the time the test measured (plus 20 ms for the
        slot given back after the last byte left)."""
        lo = sum(x["gen"] * price[x["model"]] for x in rows)
        hi = sum((x["took"] + 0.02) * price[x["model"]] for x in rows)
        return lo, hi, len(rows), sum(x["tokens"] for x in rows)

    by = {"models": {m["model"]: m for m in h["models"]}, "keys": {k["key"]: k for k in h["keys"]}}
    assert set(by["models"]) == {"m-a", "m-b"} and set(by["keys"]) == {"alpha", "beta"}, by
    metrics = fleet.parse_prometheus(admin_get(d, "/metrics").text)
    for kind, field, names, prom in (("models", "model", ("m-a", "m-b"), "fleetgate_cost_per"),
                                     ("keys", "key", ("alpha", "beta"), "fleetgate_caller_cost_per")):
        for name in names:
            row = by[kind][name]
            lo, hi, n, tokens = expect([x for x in done if x[field] == name])
            assert lo <= row["cost"] <= hi, (name, lo, row["cost"], hi)
            assert row["requests"] == n and row["tokens"] == tokens, row
            per_1k, per_m = row["cost"] / n * 1000, row["cost"] / tokens * 1e6
            assert lo / n * 1000 <= row["cost_per_1k_requests"] <= hi / n * 1000, row
            close(row["cost_per_1k_requests"], per_1k, 1e-9, f"{name} per 1k requests")
            close(row["cost_per_million_tokens"], per_m, 1e-9, f"{name} per 1M tokens")
            # /metrics says the same (nothing ran in between: the busy cost stands still)
            label = "model" if kind == "models" else "caller"
            close(metrics[f'{prom}_1k_requests{{{label}="{name}"}}'], per_1k, 1e-6, f"metrics {name}")
            close(metrics[f'{prom}_million_tokens{{{label}="{name}"}}'], per_m, 1e-6, f"metrics {name}")
        # the models' costs, and the keys', add up to the fleet's busy cost
        close(sum(r["cost"] for r in h[kind]), f["busy_cost"], 1e-9, f"sum of {kind}")
    lo, hi, _, _ = expect(done)
    assert lo <= f["busy_cost"] <= hi, (lo, f["busy_cost"], hi)
    # a phone waiting costs money too: here most of the fleet's time was idle
    assert f["idle_cost"] > f["busy_cost"] > 0, f
    # the day holds the same (a gateway younger than an hour)
    assert c["day"]["fleet"]["requests"] == 6
    close(c["day"]["models"][0]["cost"], h["models"][0]["cost"], 1e-9, "day = hour")
    assert metrics['fleetgate_cost_info{currency="EUR"}'] == 1
    assert metrics["fleetgate_fleet_cost_per_day"] == 1.6
    close(metrics["fleetgate_fleet_busy_cost_total"], f["busy_cost"], 1e-6, "busy total")
    # the fleet's cost keeps growing between the two readings: within a second's worth
    assert f["cost"] <= metrics["fleetgate_fleet_cost_last_hour"] <= f["cost"] + 1.6 * T(5) / DAY
    assert metrics["fleetgate_fleet_idle_cost_last_hour"] >= f["idle_cost"]
    # the status page's snapshot carries the same figures
    st = admin_get(d, "/admin/v1/status").json()["costs"]
    assert st["currency"] == "EUR" and st["hour"]["fleet"]["requests"] == 6, st
    assert {m["model"] for m in st["hour"]["models"]} == {"m-a", "m-b"}


def heartbeat(gw, body):
    raw, h = g.heartbeat_headers(body, secret=SECRET)
    return requests.post(gw.url + "/fleet/v1/heartbeat", data=raw, timeout=T(5), headers=h)


def test_a_phone_says_its_price_and_a_file_wins(procs, sim, gateway):
    filed = g.phone(sim, "filed", slots=1)
    reps = [dict(g.replica(filed, cost_per_day=0.5), heartbeats=True)]

    def config(ports):
        cfg = g.gw_config(ports[0], reps, costs={"max_claimed_per_day": 2},
                          fleet={"secret_env": "FG_SECRET", "heartbeat_interval_s": 0.5})
        cfg["admin"] = {"listen": f"{HOST}:{ports[1]}", "token": ADMIN_TOKEN}
        return cfg
    d = gateway(config, n_ports=2, env={"FG_SECRET": SECRET},
                ready=lambda d: (g.replicas_ready(d) or 0) >= 1)
    # a phone that joins by itself says what it costs (fleetgate-agent --cost-per-day)
    procs.spawn("phone", lambda ports: fleet.sim_argv(
        ports[0], slots=2, prefill_tps=500, decode_tps=50, time_scale=10, id="phone-c",
        extra_args=("--gateway", d.url, "--public-url", f"http://{HOST}:{ports[0]}",
                    "--cost-per-day", "0.8")),
        env={"FLEETGATE_FLEET_SECRET": SECRET})

    def reps_now():
        return {r["id"]: r for r in admin_get(d, "/admin/v1/replicas").json()["replicas"]}
    assert fleet.wait_until(lambda: "phone-c" in reps_now(), T(10)), d.logs()
    assert reps_now()["phone-c"]["cost_per_day"] == 0.8
    assert reps_now()["phone-c"]["cost_source"] == "phone"
    # the file's price wins over what its phone says
    body = {"id": "filed", "url": filed.url, "models": [g.MODEL], "slots": 1, "cost_per_day": 0.9}
    r = heartbeat(d, body)
    assert r.status_code == 200, r.text
    assert reps_now()["filed"]["cost_per_day"] == 0.5
    assert reps_now()["filed"]["cost_source"] == "config"
    # a claim beyond costs.max_claimed_per_day is cut to it; nonsense is refused
    greedy = {"id": "greedy", "url": filed.url, "models": [g.MODEL], "slots": 1, "cost_per_day": 50}
    r = heartbeat(d, greedy)
    assert r.status_code == 200, r.text
    assert reps_now()["greedy"]["cost_per_day"] == 2
    for bad in (-1, "a lot", 1e10):
        time.sleep(0.3)  # one heartbeat per id per quarter interval
        r = heartbeat(d, dict(greedy, cost_per_day=bad))
        g.check_error(r, 400, "invalid_heartbeat", what=repr(bad))
    assert reps_now()["greedy"]["cost_per_day"] == 2
    c = admin_get(d, "/admin/v1/costs").json()
    assert c["currency"] == "ACU" and abs(c["cost_per_day"] - (0.5 + 0.8 + 2)) < 1e-9, c
    m = fleet.parse_prometheus(admin_get(d, "/metrics").text)
    assert m['fleetgate_replica_cost_per_day{replica="phone-c"}'] == 0.8
    assert abs(m["fleetgate_fleet_cost_per_day"] - 3.3) < 1e-9
