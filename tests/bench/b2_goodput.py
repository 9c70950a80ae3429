#!/usr/bin/python3
"""B2 — goodput on a simulated phone fleet, per proxy.

24 simulated phones (fleet.py: flagship/midrange/budget classes from
tests/bench/fleet-profiles.json, 1-4 slots, 54 slots in all), run --time-scale K
times faster than real time. An open-loop load generator (Poisson arrivals, aiohttp) mixes
fraud reviews (7,000-token prompts, 8 tokens out), scam filters (100 tokens, 4 out) and
streamed chats (500 tokens, 300 out) at 50/80/95/120 % of the fleet's capacity, in three
scenarios: steady; churn (a fifth of the phones go offline, hang or answer 503 at
staggered times and come back); slow (the biggest flagship phone turns 5x slower).
Every proxy gets the same arrival schedule (same seed), a fresh fleet and a fresh proxy.

Times reported are *phone seconds* (wall seconds x K): what a client of a real fleet
would see. Capacity: sum over phones of slots / mix-weighted service time (fleet.py).

    tests/bench/b2_goodput.py            # full matrix: 4 loads x 3 scenarios x 4 proxies (~16 min)
    tests/bench/b2_goodput.py --quick    # 80 % load, 3 scenarios, 4 proxies (~3 min)
    tests/bench/b2_goodput.py --smoke    # 4 phones, fleetgate only, 3 s: does it work
Results: tests/bench/results/b2_goodput.{json,csv} (+ per-request CSV), charts b2_*.png."""

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as bl  # noqa: E402
import fleet  # noqa: E402
import peers  # noqa: E402

try:
    import aiohttp
except ImportError:  # pragma: no cover
    sys.exit("b2: needs aiohttp for /usr/bin/python3 (apt-get install -y python3-aiohttp)")

LOADS = (50, 80, 95, 120)
SCENARIOS = ("steady", "churn", "slow")


# ------------------------------------------------------------------------------ scenarios

def fault_plans(scenario, phones, lead_sim, window_sim):
    """Fault windows (simulated seconds from the sim's start) per phone id, and a list of
    (start, end, phone_id, factor) capacity changes for computing surviving capacity:
    factor 0 = out, 0.2 = 5x slow."""
    plans, changes = {}, []
    if scenario == "churn":
        # A fifth of the phones, across classes and slot counts.
        n = max(1, len(phones) // 5)
        order = sorted(range(len(phones)), key=lambda i: (i * 7) % len(phones))
        picked = [phones[i] for i in order[:n]]
        kinds = ("offline", "hang", "error503")
        step = window_sim * 0.7 / max(1, n)
        dur = window_sim * 0.25
        for i, p in enumerate(picked):
            at = lead_sim + window_sim * 0.1 + i * step
            plans[p["id"]] = [{"at_s": round(at, 2), "kind": kinds[i % 3], "dur_s": round(dur, 2)}]
            changes.append((at - lead_sim, at - lead_sim + dur, p["id"], 0.0, kinds[i % 3]))
    elif scenario == "slow":
        p = max(phones, key=lambda q: q["slots"] * q["prefill_tps"])
        at = lead_sim + window_sim * 0.1
        plans[p["id"]] = [{"at_s": round(at, 2), "kind": "slow", "dur_s": 100000}]
        changes.append((at - lead_sim, 1e9, p["id"], 0.2, "slow"))
    return plans, changes


def surviving_capacity(phones, changes, window_sim, steps=200):
    """Mean and minimum over the window of the capacity (requests / sim s) left."""
    caps = []
    for k in range(steps):
        t = (k + 0.5) * window_sim / steps
        alive, slow = [], {}
        for p in phones:
            f = 1.0
            for (a, b, pid, factor, _) in changes:
                if pid == p["id"] and a <= t < b:
                    f = min(f, factor)
            if f == 0:
                continue
            if f < 1:
                slow[p["id"]] = 1 / f
            alive.append(p)
        caps.append(fleet.capacity(alive, slow=slow))
    return sum(caps) / len(caps), min(caps)


# ------------------------------------------------------------------------------ load generator

async def one_request(session, url, headers, body, wc, t_sched, t0, timeout_s, rec):
    now = time.monotonic()
    rec.update({"cls": wc["name"], "t_sched": t_sched, "t_send": now - t0, "status": None,
                "kind": None, "ttft": None, "latency": None, "replica": None})
    try:
        to = aiohttp.ClientTimeout(total=timeout_s)
        async with session.post(url, data=body, headers=headers, timeout=to) as r:
            rec["status"] = r.status
            rec["replica"] = r.headers.get("x-fleetgate-replica")
            if wc["stream"]:
                first, done, err, tail = None, False, False, b""
                async for chunk in r.content.iter_any():
                    if first is None and chunk:
                        first = time.monotonic()
                    tail = (tail + chunk)[-4096:]
                    if b'"error"' in chunk:
                        err = True
                    if b"data: [DONE]" in tail:
                        done = True
                end = time.monotonic()
                if first is not None:
                    rec["ttft"] = first - now
                if r.status != 200:
                    rec["kind"] = f"http_{r.status}"
                elif err:
                    rec["kind"] = "stream_error_event"
                elif not done:
                    rec["kind"] = "stream_truncated"
            else:
                data = await r.read()
                end = time.monotonic()
                if r.status != 200:
                    rec["kind"] = f"http_{r.status}"
                else:
                    try:
                        j = json.loads(data)
                        if not j.get("choices"):
                            rec["kind"] = "bad_body"
                    except ValueError:
                        rec["kind"] = "bad_body"
            rec["latency"] = end - now
    except asyncio.TimeoutError:
        rec["kind"] = "client_timeout"
        rec["latency"] = time.monotonic() - now
    except aiohttp.ClientConnectorError:
        rec["kind"] = "connect_error"
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError,
            aiohttp.ClientOSError) as e:
        rec["kind"] = "stream_truncated" if wc["stream"] and rec["status"] == 200 else "conn_reset"
        rec["detail"] = type(e).__name__
    except aiohttp.ClientError as e:
        rec["kind"] = "client_error"
        rec["detail"] = repr(e)[:200]
    rec["ok"] = rec["kind"] is None


async def drive(url, headers, sched, bodies, timeout_s):
    conn = aiohttp.TCPConnector(limit=0, force_close=False, enable_cleanup_closed=True)
    recs = [dict() for _ in sched]
    async with aiohttp.ClientSession(connector=conn) as session:
        t0 = time.monotonic()
        tasks = []
        for i, (ts, wc) in enumerate(sched):
            d = t0 + ts - time.monotonic()
            if d > 0:
                await asyncio.sleep(d)
            tasks.append(asyncio.create_task(one_request(session, url, headers, bodies[i], wc, ts, t0,
                                                         timeout_s, recs[i])))
        await asyncio.wait(tasks, timeout=timeout_s + 30)
        for tk in tasks:
            if not tk.done():
                tk.cancel()
        t_end = time.monotonic() - t0
    lag = [r["t_send"] - r["t_sched"] for r in recs if "t_send" in r]
    return recs, t_end, (max(lag) if lag else 0)


# ------------------------------------------------------------------------------ one cell

def run_cell(proxy_name, scenario, load, a, phones, cap_sim, sched, bodies, wd):
    K = a.scale
    procs = bl.Procs()
    cell_wd = wd / f"{proxy_name}-{scenario}-{load}"
    cell_wd.mkdir(parents=True, exist_ok=True)
    lead = a.lead
    window_sim = a.window * K
    plans, changes = fault_plans(scenario, phones, lead * K, window_sim)
    t_fleet = time.monotonic()
    fl = fleet.start_fleet(procs, cell_wd, phones, K, plans, cpu=None)
    t = peers.default_timeouts(K)
    px = peers.start(proxy_name, procs, cell_wd, fl, t, fleet.MODEL, scale=K, cpu=None)
    if scenario == "steady" and load == a.loads[0]:
        bl.keep_config("b2", px.config, f"{proxy_name}-{Path(px.config).name}")
    d = t_fleet + lead - time.monotonic()
    if d > 0:
        time.sleep(d)
    else:
        print(f"# warning: {proxy_name} took {lead - d:.1f} s to start (> lead {lead} s)")
    cpu0 = sum(bl.cpu_ticks(p) or 0 for p in bl.tree_pids(px.proc.pid))
    rss = []

    async def sampler(stop):
        while not stop.is_set():
            rss.append(bl.tree_rss_kb(px.proc.pid))
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except asyncio.TimeoutError:
                pass

    async def main():
        stop = asyncio.Event()
        st = asyncio.create_task(sampler(stop))
        hdrs = {"Content-Type": "application/json", **px.headers}
        res = await drive(px.url() + "/v1/chat/completions", hdrs, sched, bodies,
                          a.client_timeout_sim / K)
        stop.set()
        await st
        return res

    recs, t_end, lag = asyncio.run(main())
    cpu1 = sum(bl.cpu_ticks(p) or 0 for p in bl.tree_pids(px.proc.pid))
    alive = px.proc.poll() is None
    procs.stop_all()
    mean_cap, min_cap = surviving_capacity(phones, changes, window_sim)
    offered = len(sched) / a.window                       # wall req/s
    ok = [r for r in recs if r.get("ok")]
    fails = {}
    for r in recs:
        if not r.get("ok"):
            k = r.get("kind") or "unfinished"
            fails[k] = fails.get(k, 0) + 1
    good = len(ok) / a.window
    cls_stats = {}
    for c in ("fraud", "scam", "chat"):
        lat = [r["latency"] * K for r in ok if r["cls"] == c]
        n_all = sum(1 for r in recs if r.get("cls") == c)
        s = {"n": n_all, "ok": len(lat), "p50": bl.pct(lat, 50), "p95": bl.pct(lat, 95),
             "p99": bl.pct(lat, 99)}
        if c == "chat":
            tt = [r["ttft"] * K for r in ok if r["cls"] == c and r.get("ttft") is not None]
            s.update({"ttft_p50": bl.pct(tt, 50), "ttft_p95": bl.pct(tt, 95), "ttft_p99": bl.pct(tt, 99)})
        cls_stats[c] = s
    res = {"proxy": proxy_name, "scenario": scenario, "load_pct": load,
           "offered_rps": offered, "capacity_rps": cap_sim * K,
           "surviving_capacity_rps": mean_cap * K, "surviving_capacity_min_rps": min_cap * K,
           "has_capacity": offered <= mean_cap * K,
           "sent": len(recs), "ok": len(ok), "failed": sum(fails.values()), "fail_kinds": fails,
           "goodput_rps": good, "goodput_share_offered": len(ok) / max(1, len(recs)),
           "goodput_share_capacity": good / (cap_sim * K), "classes": cls_stats,
           "proxy_cpu_s": cpu1 - cpu0, "proxy_rss_max_kb": max([x for x in rss if x] or [0]),
           "proxy_alive_at_end": alive, "drain_s": t_end - a.window, "send_lag_max_s": lag,
           "fault_changes": [list(c) for c in changes]}
    if not alive:
        res["fail_kinds"]["proxy_died"] = 1
    per_req = [[proxy_name, scenario, load, r.get("cls"), round(r.get("t_send", 0), 4),
                r.get("status"), r.get("kind") or "ok",
                round(r["latency"] * K, 3) if r.get("latency") is not None else "",
                round(r["ttft"] * K, 3) if r.get("ttft") is not None else "", r.get("replica") or ""]
               for r in recs]
    return res, per_req


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--proxies", default="nginx,haproxy,portkey,fleetgate")
    ap.add_argument("--loads", default=",".join(map(str, LOADS)), help="percent of capacity")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--scale", type=float, default=10.0, help="sim time scale K")
    ap.add_argument("--window", type=float, default=10.0, help="wall seconds of offered load per cell")
    ap.add_argument("--lead", type=float, default=3.0, help="wall seconds from fleet start to load start")
    ap.add_argument("--client-timeout-sim", type=float, default=300.0,
                    help="a client gives up after this many phone seconds (default 5 min)")
    ap.add_argument("--phones", type=int, default=0, help="fewer phones (default: the 24 of fleet.py)")
    ap.add_argument("--seed", type=int, default=20261129)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--no-chart", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.loads, a.window = "80", 8.0
    if a.smoke:
        a.proxies, a.loads, a.scenarios, a.window, a.phones, a.lead = "fleetgate", "80", "churn", 3.0, 5, 1.5
        a.no_chart = True
    a.loads = [int(x) for x in str(a.loads).split(",") if x]
    scen = [s for s in a.scenarios.split(",") if s]
    names = peers.available([n for n in a.proxies.split(",") if n])
    phones = fleet.build(a.phones or None)
    classes = fleet.workload_classes()
    cap_sim = fleet.capacity(phones, classes)
    K = a.scale
    print(f"# fleet: {len(phones)} phones, {sum(p['slots'] for p in phones)} slots; capacity "
          f"{cap_sim:.2f} req/phone-s = {cap_sim * K:.1f} req/s wall at time scale {K:g}")
    wd = bl.workdir("b2")
    results, per_req = [], []
    t_start = time.monotonic()
    for scenario in scen:
        for load in a.loads:
            rate = cap_sim * K * load / 100.0
            sched = fleet.schedule(rate, a.window, a.seed + load)
            rng = random.Random(a.seed * 7 + load)
            bodies = [fleet.make_body(rng, wc) for _, wc in sched]
            order = names[:] if (a.loads.index(load) + scen.index(scenario)) % 2 == 0 else names[::-1]
            for n in order:
                res, pr = run_cell(n, scenario, load, a, phones, cap_sim, sched, bodies, wd)
                results.append(res)
                per_req += pr
                fr = res["classes"]["fraud"]
                print(f"# {scenario:6} {load:3d}% {n:9} sent {res['sent']:4d} ok {res['ok']:4d} "
                      f"failed {res['failed']:3d} {res['fail_kinds'] or ''} goodput "
                      f"{res['goodput_share_offered'] * 100:5.1f}% of offered, "
                      f"{res['goodput_share_capacity'] * 100:5.1f}% of capacity; fraud p99 "
                      f"{bl.fmt(fr['p99'], 0)} s; chat TTFT p50 {bl.fmt(res['classes']['chat'].get('ttft_p50'), 1)} s "
                      f"(drain {res['drain_s']:.1f} s)", flush=True)
    wall = time.monotonic() - t_start

    headers = ["scenario", "load %", "proxy", "sent", "ok", "failed", "failed by kind",
               "goodput/offered", "goodput/capacity", "fraud p50/p95/p99 s", "scam p50/p95/p99 s",
               "chat p50/p95/p99 s", "chat TTFT p50/p99 s"]
    rows = []
    for r in results:
        c = r["classes"]
        f3 = lambda s: f"{bl.fmt(s['p50'], 1)}/{bl.fmt(s['p95'], 1)}/{bl.fmt(s['p99'], 1)}"
        rows.append([r["scenario"], r["load_pct"], r["proxy"], r["sent"], r["ok"], r["failed"],
                     " ".join(f"{k}:{v}" for k, v in sorted(r["fail_kinds"].items())) or "-",
                     f"{r['goodput_share_offered'] * 100:.1f}%", f"{r['goodput_share_capacity'] * 100:.1f}%",
                     f3(c["fraud"]), f3(c["scam"]), f3(c["chat"]),
                     f"{bl.fmt(c['chat'].get('ttft_p50'), 1)}/{bl.fmt(c['chat'].get('ttft_p99'), 1)}"])
    print()
    print(bl.table(headers, rows))

    # Targets.
    verdict = []
    fg = [r for r in results if r["proxy"] == "fleetgate"]
    bad = [r for r in fg if r["has_capacity"] and r["failed"]]
    verdict.append(f"zero failed requests for fleetgate where the surviving fleet has capacity: "
                   f"{'met' if not bad else 'MISSED'} ({len([r for r in fg if r['has_capacity']])} cells; "
                   + (", ".join(f"{r['scenario']} {r['load_pct']}%: {r['fail_kinds']}" for r in bad) or "no failures") + ")")
    for r in fg:
        peers_ = [q for q in results if q["scenario"] == r["scenario"] and q["load_pct"] == r["load_pct"]
                  and q["proxy"] != "fleetgate"]
        if not peers_:
            continue
        best = max(peers_, key=lambda q: q["goodput_rps"])
        r["best_peer"] = best["proxy"]
        r["goodput_vs_best_peer"] = r["goodput_rps"] / best["goodput_rps"] if best["goodput_rps"] else None
        fp = [q["classes"]["fraud"]["p99"] for q in peers_ if q["classes"]["fraud"]["p99"] is not None
              and q["classes"]["fraud"]["ok"] >= 0.9 * q["classes"]["fraud"]["n"]]
        r["fraud_p99_best_peer"] = min(fp) if fp else None
        if r["scenario"] == "churn":
            g = r["goodput_vs_best_peer"]
            verdict.append(f"churn {r['load_pct']}%: goodput fleetgate / best peer ({best['proxy']}) = "
                           f"{bl.fmt(g, 2)} ({'met' if g is not None and g >= 1.2 else 'MISSED'} >= 1.2)")
        fr = r["classes"]["fraud"]["p99"]
        bp = r["fraud_p99_best_peer"]
        verdict.append(f"{r['scenario']} {r['load_pct']}%: fraud p99 fleetgate {bl.fmt(fr, 0)} s vs best peer "
                       f"{bl.fmt(bp, 0)} s ({'met' if fr is not None and (bp is None or fr < bp) else 'MISSED'})")
    for v in verdict:
        print("# target " + v)
    name = "b2_goodput_smoke" if a.smoke else ("b2_goodput_quick" if a.quick else "b2_goodput")
    out = bl.save_results("b2_goodput", name, {
           "params": {"scale": K, "window_s": a.window, "lead_s": a.lead,
                      "client_timeout_phone_s": a.client_timeout_sim, "seed": a.seed,
                      "loads": a.loads, "scenarios": scen, "proxies": names,
                      "timeouts_wall_s": peers.default_timeouts(K)},
           "fleet": phones, "workload": classes, "capacity_req_per_phone_s": cap_sim,
           "wall_s": wall, "results": results, "verdict": verdict}, headers, rows)
    bl.save_csv(name + "_requests.csv", ["proxy", "scenario", "load_pct", "class", "t_send_s", "status",
                                         "outcome", "latency_phone_s", "ttft_phone_s", "replica"], per_req)
    print(f"# wall time {wall:.0f} s")
    if not a.no_chart:
        import charts
        for p in charts.b2(out, name):
            print("# chart:", p)
    if a.smoke:
        r = results[0]
        if r["ok"] == 0 or not r["proxy_alive_at_end"]:
            sys.exit(f"b2 smoke failed: {r}")
        print("b2 smoke ok")


if __name__ == "__main__":
    main()
