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
Every request carries a unique x-request-id, which every proxy passes on to the phone.

Two more cells (issue 20), at 80 % only by default (`hung@80`, `device@80`):

hung: two phones, a 2-slot flagship and a 3-slot midrange (HUNG; 12 % of the capacity),
  hang from 20 % to 60 % of the window (the sim's `hang` fault: requests are read and never answered; running ones freeze and keep their slot
  until their caller gives up); the rest serve. The sims log at info level, a line per request with its x-request-id,
  so the requests that reached a hung phone while it hung are known: those that came in
  during the hang and those on the phone when it began (frozen). For each: latency from
  when the hung phone received it to the client's answer (phone s; also from when the
  client sent it), and that over its *predicted time* = fleet.service_s(hung phone,
  class): the class's prefill + decode time on a free slot of the phone it was sent to,
  what a router that chose that phone expected (no queueing; a scam filter's is 0.31 s
  on the flagship, a fraud review's 15.2 s). Reported: how many, answered 200, failures,
  latency p50/p95/max, ratio p50/p95/max and how many were answered 200 within 2x.
  Expect a handful per proxy: the requests on the two phones' 5 slots as the hang
  begins, and the few sent before a router stops sending there.

device: every phone's agent reads a fake /sys (--sysfs-root, fleet.write_device_tree):
  two phones at 8 % battery and not charging (DEVICE_LOW, 7 % of the capacity), two hot
  ones at 48 °C with the CPU clock capped to 60 % (DEVICE_HOT) that really run
  HOT_FACTOR = 2x slower (a `slow` fault with that factor) for the whole cell, the rest
  cool and charging. For fleetgate the phones send signed heartbeats with their readings
  (--gateway; the replica file takes them, "heartbeats": true), as in a deployment:
  its scheduler.device defaults (floor 10 %, low 20 %, hot_c 45, clock_cap_ratio 0.8,
  hot_slowdown 1.5) hold the low-battery phones back and plan the hot ones
  max(1.5, 1/0.6) = 1.67x slower until their answers say otherwise. nginx and HAProxy
  cannot read device state. Reported per proxy: requests served and slot-seconds by the
  low-battery phones, the hot ones and the rest (from the sims' logs) against their share
  of the capacity, latency p50/p95/p99 per group; for fleetgate its admin API's
  held_back, device_slots and device_slowdown as the load starts and half way through.

join (fleetgate only: nginx and HAProxy take no new phone without a reload): a 2-slot
  flagship (JOIN) runs from the start but is missing from fleetgate's replicas; at 30 % of
  the window a replica file naming it without rates is written into the gateway's
  replicas_dir, as an operator adds a phone to a busy fleet. Reported: how long after the
  file was written the first request it served was sent (phone s; the target is within a
  minute), and how many of the requests sent after it joined it served, by class.

Hedging (every fleetgate cell): after the load, fleetgate's /metrics on an admin listener
give its hedges started, won and wasted, and the phone slot time of hedges against all
attempts' (fleetgate_slot_seconds_total); the target is at most 5 % extra.

Verification (issue 32), --verify-ab: fleetgate runs twice in each cell, with its answers
verified (its default) and as "fleetgate-noverify" (verify.enabled false), on the same
phones with the same arrivals, alternating which goes first. Reported per cell: checks run,
the shadow requests' slot-seconds (fleetgate_verify_slot_seconds_total) and their share of
all attempts' (target at most 3 %), the phones quarantined (every B2 phone is honest:
target 0), and the reviews' p99 with / without (target: moves by no more than 5 %). The
machine's load average as each run starts is kept; --repeat N runs every cell N times and
the ratio is taken of the medians.

Times reported are *phone seconds* (wall seconds x K): what a client of a real fleet
would see. Capacity: sum over phones of slots / mix-weighted service time (fleet.py).

    tests/bench/b2_goodput.py            # 4 loads x 3 scenarios + hung@80 + device@80, 4 proxies (~20 min)
    tests/bench/b2_goodput.py --quick    # 80 % load, 5 scenarios, 4 proxies (~5 min)
    tests/bench/b2_goodput.py --smoke    # 5 phones, fleetgate only, churn, 3 s: does it work
    tests/bench/b2_goodput.py --proxies nginx,haproxy,fleetgate --loads 80 --scenarios hung,device
    tests/bench/b2_goodput.py --verify-ab --proxies nginx,haproxy,fleetgate --repeat 2   # verification's cost
Results: tests/bench/results/b2_goodput.{json,csv} (+ per-request CSV), charts b2_*.png."""

import argparse
import asyncio
import json
import os
import random
import statistics
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
# name@LOAD runs that scenario at LOAD % only (the hung and device cells, issue 20).
SCENARIOS = ("steady", "churn", "slow", "hung@80", "device@80", "join@80")

# The hung cell: these phones hang (when the fleet has them; else the nearest of their
# class): a 2-slot flagship and a 3-slot midrange, 12 % of the fleet's capacity, from
# 20 % to 60 % of the window. (A second window later adds nothing: every router keeps a
# phone that hung out for a while, so it catches no requests.)
HUNG = ("flag-03", "mid-01")
HUNG_WINDOWS = ((0.2, 0.4),)   # (start, length) as shares of the window
# The device cell: two phones low on battery and not charging (8 %: under the gateway's
# floor of 10 %), two hot ones (48 °C, over hot_c 45; CPU clock capped to 60 %) that
# really are HOT_FACTOR times slower for the whole cell; every other phone is cool and
# charging. Low: 7 % of the capacity, hot: 12 % (6 % lost to the heat).
DEVICE_LOW = ("flag-05", "mid-04")
DEVICE_HOT = ("flag-03", "mid-01")
LOW_TREE = {"battery_pct": 8, "status": "Discharging", "cpu_temp_c": 34.0, "clock_ratio": 1.0}
HOT_TREE = {"battery_pct": 76, "status": "Charging", "cpu_temp_c": 48.0, "clock_ratio": 0.6}
COOL_TREE = {"battery_pct": 81, "status": "Charging", "cpu_temp_c": 36.0, "clock_ratio": 1.0}
HOT_FACTOR = 2.0
# The join cell (fleetgate only): this phone (a 2-slot flagship) runs from the start but is
# not in fleetgate's replicas; at JOIN_AT of the window a replica file naming it, without
# rates, lands in the gateway's replicas_dir, as an operator adds a phone to a busy fleet.
JOIN = ("flag-04",)
JOIN_AT = 0.3
ADMIN_TOKEN = "b2-bench-admin-token-0123456789"
# --verify-ab: fleetgate without answer checks, beside fleetgate with them (its default: a
# fresh gateway, every phone a newcomer), and fleetgate with them whose data_dir holds a long
# record for every phone (TRUSTED_PASSES checks passed: checked at verify.min_rate, as in a
# fleet that has served for a while)
NOVERIFY = "fleetgate-noverify"
TRUSTED = "fleetgate-trusted"
TRUSTED_PASSES = 250
# a sim's "request" log line with one of these outcomes answered the request
FINISHED = ("stop", "length", "tool_calls")


def pick(phones, wanted, taken=(), fewest=False):
    """The phones named in `wanted`; a name the fleet lacks (a --phones N fleet) gives the
    first phone of its class (else any) with 2+ slots not yet picked (fewest: the one of
    its class with the fewest slots)."""
    out, used = [], set(taken)
    for w in wanted:
        p = next((q for q in phones if q["id"] == w and q["id"] not in used), None)
        if p is None:
            pre = w.split("-")[0]
            cands = [q for q in phones if q["id"] not in used]
            same = [q for q in cands if q["id"].startswith(pre)]
            if fewest and same:
                p = min(same, key=lambda q: q["slots"])
            else:
                p = next((q for q in same if q["slots"] >= 2), None) or \
                    next((q for q in cands if q["slots"] >= 2), None) or (cands[0] if cands else None)
        if p is not None:
            out.append(p)
            used.add(p["id"])
    return out


def device_groups(phones):
    """{"low": [ids], "hot": [ids]} of the device cell."""
    low = pick(phones, DEVICE_LOW, fewest=True)
    hot = pick(phones, DEVICE_HOT, taken=[p["id"] for p in low])
    return {"low": [p["id"] for p in low], "hot": [p["id"] for p in hot]}


def device_trees(scenario, phones):
    """{phone_id: fleet.write_device_tree keywords} for the device cell, else None."""
    if scenario != "device":
        return None
    g = device_groups(phones)
    return {p["id"]: (LOW_TREE if p["id"] in g["low"] else HOT_TREE if p["id"] in g["hot"] else COOL_TREE)
            for p in phones}


# ------------------------------------------------------------------------------ scenarios

def fault_plans(scenario, phones, lead_sim, window_sim):
    """Fault windows (simulated seconds from the sim's start) per phone id, and a list of
    (start, end, phone_id, factor, kind) capacity changes for computing surviving
    capacity: factor 0 = out, 0.2 = 5x slow. Low-battery phones of the device cell are
    physically able: they count as capacity (a gateway that spares them gives it up)."""
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
    elif scenario == "hung":
        for p in pick(phones, HUNG):
            plans[p["id"]] = []
            for w_at, w_dur in HUNG_WINDOWS:
                at, dur = lead_sim + window_sim * w_at, window_sim * w_dur
                plans[p["id"]].append({"at_s": round(at, 2), "kind": "hang", "dur_s": round(dur, 2)})
                changes.append((at - lead_sim, at - lead_sim + dur, p["id"], 0.0, "hang"))
    elif scenario == "device":
        for pid in device_groups(phones)["hot"]:
            plans[pid] = [{"at_s": 0, "kind": "slow", "dur_s": 1e6, "factor": HOT_FACTOR}]
            changes.append((-1e9, 1e9, pid, 1 / HOT_FACTOR, "hot"))
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

async def one_request(session, url, headers, body, wc, t_sched, t0, timeout_s, rec, rid=None):
    now = time.monotonic()
    rec.update({"cls": wc["name"], "t_sched": t_sched, "t_send": now - t0, "status": None,
                "kind": None, "ttft": None, "latency": None, "replica": None, "rid": rid,
                "t_send_wall": time.time(), "t_end_wall": None})
    if rid:
        headers = dict(headers, **{"x-request-id": rid})  # every proxy passes it on to the phone
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
            rec["t_end_wall"] = rec["t_send_wall"] + rec["latency"]
    except asyncio.TimeoutError:
        rec["kind"] = "client_timeout"
        rec["latency"] = time.monotonic() - now
        rec["t_end_wall"] = rec["t_send_wall"] + rec["latency"]
    except aiohttp.ClientConnectorError:
        rec["kind"] = "connect_error"
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError,
            aiohttp.ClientOSError) as e:
        rec["kind"] = "stream_truncated" if wc["stream"] and rec["status"] == 200 else "conn_reset"
        rec["detail"] = type(e).__name__
    except aiohttp.ClientError as e:
        rec["kind"] = "client_error"
        rec["detail"] = repr(e)[:200]
    if rec["t_end_wall"] is None:  # failed without a latency: when the client learnt it
        rec["t_end_wall"] = time.time()
    rec["ok"] = rec["kind"] is None


async def counted(inflight, coro):
    """coro, with inflight[0] counting the requests sent and not yet answered (B7's sampler)."""
    inflight[0] += 1
    try:
        return await coro
    finally:
        inflight[0] -= 1


async def drive(url, headers, sched, bodies, timeout_s, rid_prefix="b2", inflight=None):
    conn = aiohttp.TCPConnector(limit=0, force_close=False, enable_cleanup_closed=True)
    recs = [dict() for _ in sched]
    async with aiohttp.ClientSession(connector=conn) as session:
        t0 = time.monotonic()
        tasks = []
        for i, (ts, wc) in enumerate(sched):
            d = t0 + ts - time.monotonic()
            if d > 0:
                await asyncio.sleep(d)
            one = one_request(session, url, headers, bodies[i], wc, ts, t0, timeout_s, recs[i],
                              f"{rid_prefix}-{i:05d}")
            tasks.append(asyncio.create_task(counted(inflight, one) if inflight is not None else one))
        await asyncio.wait(tasks, timeout=timeout_s + 30)
        for tk in tasks:
            if not tk.done():
                tk.cancel()
        t_end = time.monotonic() - t0
    lag = [r["t_send"] - r["t_sched"] for r in recs if "t_send" in r]
    return recs, t_end, (max(lag) if lag else 0)


# ------------------------------------------------------------------------------ hung and device cells

def hung_report(fl, hung_ids, recs, K):
    """The requests that reached a hung phone while it hung, from the hung sims' own logs
    (at info level each logs a line when a request comes in during the hang, `hung`, and
    one when a request ends, with the caller's x-request-id and its age in ms):
    `arrived` = came in during a hang; `frozen` = was on the phone (on a slot or in its
    queue) when a hang began and ended after it without an answer. A request that
    reached both hung phones counts once, at the first. Its latency is from when the hung
    phone received it to the client's last byte (or its error, or its timeout), in phone
    seconds; `client` latency is from when the client sent it. Its *predicted time* is
    fleet.service_s(hung phone, class): the prefill and decode time of its class on a free
    slot of the phone it was sent to, what a router that chose that phone expected (no
    queueing). ratio = latency / predicted time; `within 2x` counts the requests answered
    200 with ratio <= 2."""
    by_rid = {r.get("rid"): r for r in recs if r.get("rid")}
    phones = {q["id"]: q for q in fl}
    reached, windows = {}, {}
    for pid in hung_ids:
        lines = fleet.sim_log(phones[pid]["log"])
        begins = [x["wall"] for x in lines if x.get("msg") == "fault hang begins"]
        ends = [x["wall"] for x in lines if x.get("msg") == "fault hang ends"]
        windows[pid] = [[b, ends[i] if i < len(ends) else None] for i, b in enumerate(begins)]
        for x in lines:
            rid = x.get("request_id")
            if x.get("msg") != "request" or not rid or rid not in by_rid:
                continue
            came = x["wall"] - (x.get("ms") or 0) / 1000.0
            if x.get("outcome") == "hung":
                how = "arrived"
            elif (any(came < b <= x["wall"] for b in begins)
                  and x.get("outcome") not in FINISHED):
                how = "frozen"
            else:
                continue
            if rid not in reached or came < reached[rid][1]:
                reached[rid] = (pid, came, how)
    items = []
    for rid, (pid, came, how) in reached.items():
        r = by_rid[rid]
        wc = next(c for c in fleet.workload_classes() if c["name"] == r["cls"])
        pred = fleet.service_s(phones[pid], wc)
        lat = (r["t_end_wall"] - came) * K if r.get("t_end_wall") else None
        items.append({"rid": rid, "phone": pid, "how": how, "cls": r["cls"], "ok": bool(r.get("ok")),
                      "kind": r.get("kind"), "predicted_s": pred, "latency_s": lat,
                      "client_latency_s": r["latency"] * K if r.get("latency") is not None else None,
                      "ratio": lat / pred if lat is not None else None,
                      "replica": r.get("replica")})
    lat = [i["latency_s"] for i in items if i["latency_s"] is not None]
    ratio = [i["ratio"] for i in items if i["ratio"] is not None]
    within = [i for i in items if i["ok"] and i["ratio"] is not None and i["ratio"] <= 2]
    fails = {}
    for i in items:
        if not i["ok"]:
            fails[i["kind"] or "unfinished"] = fails.get(i["kind"] or "unfinished", 0) + 1
    by_cls = {}
    for c in ("fraud", "scam", "chat"):
        ci = [i for i in items if i["cls"] == c]
        by_cls[c] = {"n": len(ci), "ok": sum(1 for i in ci if i["ok"]),
                     "within_2x": sum(1 for i in ci if i in within),
                     "ratio_p50": bl.pct([i["ratio"] for i in ci if i["ratio"] is not None], 50),
                     "latency_p50_s": bl.pct([i["latency_s"] for i in ci if i["latency_s"] is not None], 50)}
    return {"phones": list(hung_ids),
            "windows_wall": windows,
            "n": len(items), "arrived": sum(1 for i in items if i["how"] == "arrived"),
            "frozen": sum(1 for i in items if i["how"] == "frozen"),
            "ok": sum(1 for i in items if i["ok"]), "failed": sum(fails.values()), "fail_kinds": fails,
            "latency_p50_s": bl.pct(lat, 50), "latency_p95_s": bl.pct(lat, 95),
            "latency_max_s": max(lat) if lat else None,
            "client_latency_p50_s": bl.pct([i["client_latency_s"] for i in items
                                            if i["client_latency_s"] is not None], 50),
            "ratio_p50": bl.pct(ratio, 50), "ratio_p95": bl.pct(ratio, 95),
            "ratio_max": max(ratio) if ratio else None,
            "within_2x": len(within), "classes": by_cls, "requests": items}


def device_report(fl, groups, recs, K, admin=None):
    """Where the device cell's requests were served, from every sim's log (the line of the
    answer, with the caller's x-request-id): requests served and slot-seconds (the
    prefill of the uncached prompt plus the decode, at the phone's rates, times
    HOT_FACTOR on a hot phone: phone seconds a slot worked) by the low-battery phones,
    the hot ones and the rest, their share of the fleet's capacity (what a router blind
    to the readings would give them), and latency p50/p95/p99 of the answered requests
    by where they were served. admin: fleetgate's /admin/v1/replicas snapshots."""
    by_rid = {r.get("rid"): r for r in recs if r.get("rid")}
    where, slot_s = {}, {}
    for q in fl:
        f = HOT_FACTOR if q["id"] in groups["hot"] else 1.0
        for x in fleet.sim_log(q["log"]):
            if x.get("msg") != "request" or x.get("outcome") not in FINISHED:
                continue
            work = ((x.get("prompt_tokens", 0) - x.get("cache_n", 0)) / q["prefill_tps"]
                    + x.get("predicted_n", 0) / q["decode_tps"]) * f
            slot_s[q["id"]] = slot_s.get(q["id"], 0.0) + work
            if x.get("request_id") in by_rid:
                where[x["request_id"]] = q["id"]
    grp = lambda pid: "low" if pid in groups["low"] else "hot" if pid in groups["hot"] else "other"
    cap_all = fleet.capacity(fl)
    total_slot = sum(slot_s.values()) or 1.0
    served = [r for r in recs if r.get("ok") and r.get("rid") in where]
    out = {"groups": groups, "served_known": len(served),
           "ok": sum(1 for r in recs if r.get("ok")), "by_group": {}}
    for g in ("low", "hot", "other"):
        ids = [q["id"] for q in fl if grp(q["id"]) == g]
        rs = [r for r in served if grp(where[r["rid"]]) == g]
        lat = [r["latency"] * K for r in rs]
        out["by_group"][g] = {
            "phones": ids, "capacity_share": fleet.capacity([q for q in fl if q["id"] in ids]) / cap_all,
            "served": len(rs), "served_share": len(rs) / max(1, len(served)),
            "slot_s": sum(slot_s.get(i, 0.0) for i in ids),
            "slot_share": sum(slot_s.get(i, 0.0) for i in ids) / total_slot,
            "p50": bl.pct(lat, 50), "p95": bl.pct(lat, 95), "p99": bl.pct(lat, 99),
            "per_phone": {i: sum(1 for r in rs if where[r["rid"]] == i) for i in ids}}
    if admin is not None:
        out["admin"] = admin
        mism = [r["rid"] for r in served if r.get("replica") and r["replica"] != where[r["rid"]]]
        out["replica_header_mismatch"] = len(mism)
    return out


async def admin_replicas(session, url, ids):
    """fleetgate's /admin/v1/replicas for the phones in ids: device readings, held_back,
    device_slots, device_slowdown; and how many phones in all are held back."""
    try:
        async with session.get(url + "/admin/v1/replicas", timeout=aiohttp.ClientTimeout(total=5),
                               headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as r:
            j = await r.json()
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        return {"error": repr(e)[:200]}
    keys = ("state", "battery_pct", "charging", "temperature_c", "cpu_max_freq_ratio", "held_back",
            "device_slots", "device_slowdown", "successes")
    reps = j.get("replicas", [])
    return {"held_back_total": sum(1 for x in reps if x.get("held_back")),
            "replicas": {x["id"]: {k: x.get(k) for k in keys} for x in reps if x["id"] in ids}}


def join_report(ids, at_s, recs, K, window):
    """The join cell: when the added phone first served a request (sent after it joined,
    answered by it: x-fleetgate-replica), in phone seconds after the file was written,
    and what it served after joining against its share of the fleet's slots."""
    out = {"phones": ids, "joined_at_phone_s": None if at_s is None else at_s * K}
    if at_s is None:
        return out
    after = [r for r in recs if r.get("t_send", -1) >= at_s]
    mine = [r for r in after if r.get("ok") and r.get("replica") in ids]
    first = min((r["t_send"] for r in mine), default=None)
    out.update({"first_sent_after_phone_s": None if first is None else (first - at_s) * K,
                "served_after": len(mine), "sent_after": len(after),
                "served_share_after": len(mine) / len(after) if after else None,
                "by_class": {c: sum(1 for r in mine if r.get("cls") == c) for c in ("fraud", "scam", "chat")},
                "window_left_phone_s": (window - at_s) * K})
    return out


async def hedging(session, url):
    """fleetgate's hedges in a cell, from its /metrics once the load is over: started, won
    and wasted, and the phone slot time of hedges against all attempts' (issue 20: at most
    5 % extra). Attempts still running (a hung phone's) are not counted yet."""
    try:
        async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=5),
                               headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as r:
            text = await r.text()
            if r.status != 200:
                return {"error": f"/metrics answered HTTP {r.status}", "hedge_share": None}
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        return {"error": repr(e)[:200], "hedge_share": None}
    m = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            try:
                m[k] = float(v)
            except ValueError:
                pass
    out = {k: m.get(f'fleetgate_hedges_total{{outcome="{k}"}}') for k in ("started", "won", "wasted")}
    reg = m.get('fleetgate_slot_seconds_total{attempt="regular"}')
    hed = m.get('fleetgate_slot_seconds_total{attempt="hedge"}')
    out["slot_s_regular"], out["slot_s_hedge"] = reg, hed
    out["hedge_share"] = hed / (reg + hed) if reg is not None and hed is not None and reg + hed > 0 else None
    # answers verified (issue 32): shadow requests' slot time (part of "regular") against all
    ver = m.get("fleetgate_verify_slot_seconds_total")
    out["slot_s_verify"] = ver
    out["verify_share"] = ver / (reg + hed) if ver is not None and reg is not None and hed is not None and reg + hed > 0 else None
    out["verify_checks"] = sum(m.get(f'fleetgate_verify_checks_total{{outcome="{k}"}}') or 0
                               for k in ("agreed", "disagreed", "undecided"))
    out["quarantines"] = m.get("fleetgate_verify_quarantines_total")
    return out


# ------------------------------------------------------------------------------ one cell

def run_cell(proxy_name, scenario, load, a, phones, cap_sim, sched, bodies, wd, run=0):
    K = a.scale
    procs = bl.Procs()
    loadavg = os.getloadavg()[0]
    # fleetgate-noverify is fleetgate with verify.enabled false
    kind = "fleetgate" if proxy_name in (NOVERIFY, TRUSTED) else proxy_name
    no_verify = {"verify": {"enabled": False}} if proxy_name == NOVERIFY else {}
    cell_wd = wd / f"{proxy_name}-{scenario}-{load}" / f"run{run}"
    cell_wd.mkdir(parents=True, exist_ok=True)
    if proxy_name == TRUSTED:
        # the records a gateway keeps across restarts (data_dir/verify.json), as after a
        # long time in service: every phone passed TRUSTED_PASSES checks in a row
        dd = cell_wd / "data"
        dd.mkdir(exist_ok=True)
        now_ms = int(time.time() * 1000)
        (dd / "verify.json").write_text(json.dumps({"version": 1, "phones": [
            {"id": p["id"], "answers": 2 * TRUSTED_PASSES, "passed": TRUSTED_PASSES, "in_row": TRUSTED_PASSES,
             "last_pass_at": now_ms} for p in phones]}))
        no_verify = {"data_dir": str(dd)}
    cell_wd.mkdir(parents=True, exist_ok=True)
    lead = a.lead
    window_sim = a.window * K
    plans, changes = fault_plans(scenario, phones, lead * K, window_sim)
    trees = device_trees(scenario, phones)
    groups = device_groups(phones) if scenario == "device" else None
    log_level = "info" if scenario in ("hung", "device") else "warn"  # a line per request
    t = peers.default_timeouts(K)
    heartbeats = scenario == "device" and kind == "fleetgate"
    admin_url = None
    join_ids = [p["id"] for p in pick(phones, JOIN)] if scenario == "join" else []
    join_dir, joined = None, {}
    if heartbeats:
        # As in a real deployment, the phones' agents send signed heartbeats carrying their
        # device readings: the gateway starts first, its replica file names the phones'
        # ports and takes their heartbeats; the phones are told its URL.
        pre = [dict(p, port=bl.free_port(), agent=True, heartbeats=True) for p in phones]
        admin_port = bl.free_port()
        admin_url = f"http://{bl.HOST}:{admin_port}"
        extra = {"fleet": {"secret_env": "FLEETGATE_FLEET_SECRET",
                           # an operator's 5 s heartbeats, 30 s of silence for down, / K
                           "heartbeat_interval_s": round(5 / K, 3), "heartbeat_timeout_s": round(30 / K, 3)},
                 "admin": {"listen": f"{bl.HOST}:{admin_port}", "token": ADMIN_TOKEN}, **no_verify}
        px = peers.start(kind, procs, cell_wd, pre, t, fleet.MODEL, scale=K, cpu=None, extra=extra,
                         env={"FLEETGATE_FLEET_SECRET": fleet.FLEET_SECRET})
        t_fleet = time.monotonic()
        fl = fleet.start_fleet(procs, cell_wd, pre, K, plans, cpu=None, devices=trees,
                               gateway=px.url(), log_level=log_level)
    else:
        t_fleet = time.monotonic()
        fl = fleet.start_fleet(procs, cell_wd, phones, K, plans, cpu=None, devices=trees,
                               log_level=log_level)
        kw, listed = {}, fl
        if kind == "fleetgate":  # its /metrics: the hedges' slot time (issue 20)
            admin_port = bl.free_port()
            admin_url = f"http://{bl.HOST}:{admin_port}"
            kw["extra"] = {"admin": {"listen": f"{bl.HOST}:{admin_port}", "token": ADMIN_TOKEN}, **no_verify}
            if scenario == "join":
                join_dir = cell_wd / "replicas.d"
                join_dir.mkdir(exist_ok=True)
                kw["extra"]["replicas_dir"] = str(join_dir)
                listed = [p for p in fl if p["id"] not in join_ids]
        px = peers.start(kind, procs, cell_wd, listed, t, fleet.MODEL, scale=K, cpu=None, **kw)
    if scenario == "steady" and load == a.loads[0] and run == 0:
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

    admin = {}

    async def snapshots():
        # what fleetgate says of the device phones as the load starts and half way through
        ids = groups["low"] + groups["hot"]
        async with aiohttp.ClientSession() as sess:
            admin["at_start"] = await admin_replicas(sess, admin_url, ids)
            await asyncio.sleep(a.window / 2)
            admin["at_half"] = await admin_replicas(sess, admin_url, ids)

    async def join():
        # the replica file an operator writes: the phone's URL, model and slots, no rates
        await asyncio.sleep(a.window * JOIN_AT)
        entries = [{k: v for k, v in e.items() if k not in ("prefill_tps", "decode_tps")}
                   for e in peers.fleetgate_replicas([p for p in fl if p["id"] in join_ids], fleet.MODEL, K)]
        tmp = join_dir / ".join.json.tmp"
        tmp.write_text(json.dumps(entries))
        tmp.rename(join_dir / "join.json")
        joined["at_s"] = time.monotonic() - t_drive[0]

    t_drive = [time.monotonic()]

    async def main():
        stop = asyncio.Event()
        st = asyncio.create_task(sampler(stop))
        t_drive[0] = time.monotonic()
        jt = asyncio.create_task(join()) if join_dir else None
        snap = asyncio.create_task(snapshots()) if groups and admin_url else None
        hdrs = {"Content-Type": "application/json", **px.headers}
        res = await drive(px.url() + "/v1/chat/completions", hdrs, sched, bodies,
                          a.client_timeout_sim / K, rid_prefix=f"b2-{proxy_name}-{scenario}-{load}")
        stop.set()
        await st
        if snap:
            await snap
        if jt:
            await jt
        if admin_url:
            async with aiohttp.ClientSession() as sess:
                admin["hedging"] = await hedging(sess, admin_url)
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
    res = {"proxy": proxy_name, "scenario": scenario, "load_pct": load, "run": run, "loadavg": loadavg,
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
    if "hedging" in admin:
        res["hedging"] = admin.pop("hedging")
    if join_dir:
        res["join"] = join_report(join_ids, joined.get("at_s"), recs, K, a.window)
    if scenario == "hung":
        res["hung"] = hung_report(fl, [p["id"] for p in pick(phones, HUNG)], recs, K)
    if scenario == "device":
        res["device"] = device_report(fl, groups, recs, K, admin if heartbeats else None)
    per_req = [[proxy_name, scenario, load, r.get("cls"), round(r.get("t_send", 0), 4),
                r.get("status"), r.get("kind") or "ok",
                round(r["latency"] * K, 3) if r.get("latency") is not None else "",
                round(r["ttft"] * K, 3) if r.get("ttft") is not None else "", r.get("replica") or ""]
               for r in recs]
    return res, per_req


def verify_ab(results):
    """Per cell, fleetgate with answer checks against fleetgate-noverify: the checks' share of
    slot-seconds, the phones quarantined, the reviews' p99 (medians of the runs) and their
    ratio, and the runs' spread (the larger relative range of either side's p99s)."""
    out = []
    cells = list(dict.fromkeys((r["scenario"], r["load_pct"]) for r in results if r["proxy"] == NOVERIFY))
    for (sc, ld), variant in [(c, v) for c in cells for v in ("fleetgate", TRUSTED)]:
        on = [r for r in results if r["proxy"] == variant and (r["scenario"], r["load_pct"]) == (sc, ld)]
        off = [r for r in results if r["proxy"] == NOVERIFY and (r["scenario"], r["load_pct"]) == (sc, ld)]
        if not on or not off:
            continue
        p_on = [r["classes"]["fraud"]["p99"] for r in on if r["classes"]["fraud"]["p99"] is not None]
        p_off = [r["classes"]["fraud"]["p99"] for r in off if r["classes"]["fraud"]["p99"] is not None]
        m_on = statistics.median(p_on) if p_on else None
        m_off = statistics.median(p_off) if p_off else None
        spreads = [(max(v) - min(v)) / min(v) for v in (p_on, p_off) if len(v) > 1 and min(v) > 0]
        hed = [r.get("hedging") or {} for r in on]
        shares = [h.get("verify_share") for h in hed if h.get("verify_share") is not None]
        out.append({"scenario": sc, "load_pct": ld, "variant": "fresh" if variant == "fleetgate" else "trusted",
                    "runs": min(len(on), len(off)),
                    "checks": statistics.median([h.get("verify_checks") or 0 for h in hed]),
                    "slot_s_verify": statistics.median([h.get("slot_s_verify") or 0 for h in hed]),
                    "verify_share": statistics.median(shares) if shares else None,
                    "verify_share_max": max(shares) if shares else None,
                    "quarantined": int(sum((r.get("hedging") or {}).get("quarantines") or 0 for r in on + off)),
                    "p99_on": m_on, "p99_off": m_off, "p99_on_runs": p_on, "p99_off_runs": p_off,
                    "ratio": m_on / m_off if m_on and m_off else None,
                    "noise": max(spreads) if spreads else None,
                    "loadavg": [r["loadavg"] for r in on + off]})
    return out


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
    ap.add_argument("--verify-ab", action="store_true",
                    help="fleetgate also without answer checks (fleetgate-noverify), same phones and arrivals")
    ap.add_argument("--repeat", type=int, default=1, help="run every cell this many times")
    a = ap.parse_args()
    if a.quick:
        a.loads, a.window = "80", 8.0
    if a.smoke:
        a.proxies, a.loads, a.scenarios, a.window, a.phones, a.lead = "fleetgate", "80", "churn", 3.0, 5, 1.5
        a.no_chart = True
    a.loads = [int(x) for x in str(a.loads).split(",") if x]
    cells = []          # (scenario, load): each name at --loads, or name@LOAD at LOAD only
    for item in [x for x in a.scenarios.split(",") if x]:
        name, _, at = item.partition("@")
        if name not in ("steady", "churn", "slow", "hung", "device", "join"):
            sys.exit(f"b2: unknown scenario {name!r} (steady, churn, slow, hung, device, join; name@LOAD)")
        for load in ([int(at)] if at else a.loads):
            if (name, load) not in cells:
                cells.append((name, load))
    scen = list(dict.fromkeys(c[0] for c in cells))
    names = peers.available([n for n in a.proxies.split(",") if n])
    if a.verify_ab and "fleetgate" in names and NOVERIFY not in names:
        names.insert(names.index("fleetgate") + 1, NOVERIFY)
        names.insert(names.index(NOVERIFY) + 1, TRUSTED)
    phones = fleet.build(a.phones or None)
    classes = fleet.workload_classes()
    cap_sim = fleet.capacity(phones, classes)
    K = a.scale
    print(f"# fleet: {len(phones)} phones, {sum(p['slots'] for p in phones)} slots; capacity "
          f"{cap_sim:.2f} req/phone-s = {cap_sim * K:.1f} req/s wall at time scale {K:g}")
    wd = bl.workdir("b2")
    results, per_req = [], []
    t_start = time.monotonic()
    all_loads = sorted({c[1] for c in cells})
    for scenario, load in cells:
        for run in range(max(1, a.repeat)):
            rate = cap_sim * K * load / 100.0
            sched = fleet.schedule(rate, a.window, a.seed + load)
            rng = random.Random(a.seed * 7 + load)
            bodies = [fleet.make_body(rng, wc) for _, wc in sched]
            order = names[:] if (all_loads.index(load) + scen.index(scenario) + run) % 2 == 0 else names[::-1]
            if scenario == "join":  # the peers cannot take a phone without a reload
                order = [n for n in order if n in ("fleetgate", NOVERIFY, TRUSTED)]
            for n in order:
                res, pr = run_cell(n, scenario, load, a, phones, cap_sim, sched, bodies, wd, run)
                results.append(res)
                per_req += pr
                fr = res["classes"]["fraud"]
                print(f"# {scenario:6} {load:3d}% {n:9} (load avg {res['loadavg']:.1f}) sent {res['sent']:4d} ok {res['ok']:4d} "
                      f"failed {res['failed']:3d} {res['fail_kinds'] or ''} goodput "
                      f"{res['goodput_share_offered'] * 100:5.1f}% of offered, "
                      f"{res['goodput_share_capacity'] * 100:5.1f}% of capacity; fraud p99 "
                      f"{bl.fmt(fr['p99'], 0)} s; chat TTFT p50 {bl.fmt(res['classes']['chat'].get('ttft_p50'), 1)} s "
                      f"(drain {res['drain_s']:.1f} s)", flush=True)
                if "hung" in res:
                    h = res["hung"]
                    print(f"#   hung phones {','.join(h['phones'])}: {h['n']} requests reached them while "
                          f"hung ({h['arrived']} came in, {h['frozen']} frozen), {h['ok']} answered 200, "
                          f"{h['within_2x']} within 2x predicted; ratio p50/p95/max {bl.fmt(h['ratio_p50'], 1)}/"
                          f"{bl.fmt(h['ratio_p95'], 1)}/{bl.fmt(h['ratio_max'], 1)}", flush=True)
                if "join" in res:
                    j = res["join"]
                    print(f"#   joined {','.join(j['phones'])} at {bl.fmt(j.get('joined_at_phone_s'), 1)} phone-s: "
                          f"first request it served sent {bl.fmt(j.get('first_sent_after_phone_s'), 1)} phone-s "
                          f"later; served {j.get('served_after')} of {j.get('sent_after')} sent after",
                          flush=True)
                if "device" in res:
                    g = res["device"]["by_group"]
                    print(f"#   served by low-battery {g['low']['served']} ({g['low']['served_share'] * 100:.1f}%), "
                          f"hot {g['hot']['served']} ({g['hot']['served_share'] * 100:.1f}%) of "
                          f"{res['device']['served_known']}", flush=True)
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
    hung_rows = [r for r in results if "hung" in r]
    if hung_rows:
        print()
        print("# hung cell: requests that reached a hung phone while it hung; latency from the hung "
              "phone's receipt to the client's answer (phone s); ratio = latency / predicted time "
              "(the class's service time on that phone, fleet.service_s)")
        hh = ["load %", "proxy", "reached (came in/frozen)", "answered 200", "failed by kind",
              "latency p50/p95/max s", "client-sent latency p50 s", "ratio p50/p95/max",
              "within 2x (200)", "within 2x by class f/s/c"]
        hr = []
        for r in hung_rows:
            h = r["hung"]
            c = h["classes"]
            hr.append([r["load_pct"], r["proxy"], f"{h['n']} ({h['arrived']}/{h['frozen']})", h["ok"],
                       " ".join(f"{k}:{v}" for k, v in sorted(h["fail_kinds"].items())) or "-",
                       f"{bl.fmt(h['latency_p50_s'], 1)}/{bl.fmt(h['latency_p95_s'], 1)}/{bl.fmt(h['latency_max_s'], 1)}",
                       bl.fmt(h["client_latency_p50_s"], 1),
                       f"{bl.fmt(h['ratio_p50'], 2)}/{bl.fmt(h['ratio_p95'], 2)}/{bl.fmt(h['ratio_max'], 2)}",
                       f"{h['within_2x']}/{h['n']}",
                       " ".join(f"{c[k]['within_2x']}/{c[k]['n']}" for k in ("fraud", "scam", "chat"))])
        print(bl.table(hh, hr))
    hedge_rows = [r for r in results if "hedging" in r]
    if hedge_rows:
        print()
        print("# fleetgate's hedges (its /metrics after the load): second attempts started, won and "
              "wasted; slot-s = phone slot time of attempts that ended (wall s); share = hedges' of all")
        print(bl.table(["scenario", "load %", "proxy", "run", "started", "won", "wasted", "slot-s all", "slot-s hedges",
                        "hedge share", "checks", "verify share", "quarantined"],
                       [[r["scenario"], r["load_pct"], r["proxy"], r["run"]] + [bl.fmt(r["hedging"].get(k), 0) for k in ("started", "won", "wasted")]
                        + [bl.fmt((r["hedging"].get("slot_s_regular") or 0) + (r["hedging"].get("slot_s_hedge") or 0), 1),
                           bl.fmt(r["hedging"].get("slot_s_hedge"), 1),
                           "n/a" if r["hedging"].get("hedge_share") is None else f"{r['hedging']['hedge_share'] * 100:.2f}%",
                           bl.fmt(r["hedging"].get("verify_checks"), 0),
                           "n/a" if r["hedging"].get("verify_share") is None else f"{r['hedging']['verify_share'] * 100:.2f}%",
                           bl.fmt(r["hedging"].get("quarantines"), 0)]
                        for r in hedge_rows]))
    dev_rows = [r for r in results if "device" in r]
    if dev_rows:
        print()
        print("# device cell: where answered requests were served (sims' logs); slot-s = phone seconds "
              "of prefill + decode; capacity = the group's nominal share of the fleet's capacity (the hot phones really give half of theirs); latency "
              "p50/p95/p99 (phone s) of the requests each group served")
        dh = ["load %", "proxy", "group", "phones", "capacity", "served", "served share", "slot-s share",
              "p50/p95/p99 s", "fleetgate admin (half way)"]
        dr = []
        for r in dev_rows:
            d = r["device"]
            for gname in ("low", "hot", "other"):
                g = d["by_group"][gname]
                note = ""
                adm = (d.get("admin") or {}).get("at_half") or {}
                adm0 = ((d.get("admin") or {}).get("at_start") or {}).get("replicas") or {}
                if gname != "other" and adm.get("replicas"):
                    note = "; ".join(f"{pid}: " + (f"slots {x['device_slots']}" if x.get("device_slots") is not None
                                                   else f"planned x{adm0.get(pid, {}).get('device_slowdown')}"
                                                        f" at start, x{x.get('device_slowdown')} half way")
                                     + ("" if x.get("held_back") else " (not held back)")
                                     for pid, x in adm["replicas"].items() if pid in g["phones"])
                elif gname == "other" and adm:
                    note = f"phones with held_back set: {adm.get('held_back_total', adm.get('error'))}"
                dr.append([r["load_pct"], r["proxy"], gname,
                           ",".join(g["phones"]) if gname != "other" else f"{len(g['phones'])} phones",
                           f"{g['capacity_share'] * 100:.1f}%", g["served"], f"{g['served_share'] * 100:.1f}%",
                           f"{g['slot_share'] * 100:.1f}%",
                           f"{bl.fmt(g['p50'], 1)}/{bl.fmt(g['p95'], 1)}/{bl.fmt(g['p99'], 1)}", note or "-"])
        print(bl.table(dh, dr))

    ab = verify_ab(results)
    if ab:
        print()
        print("# answers verified (--verify-ab): fleetgate with checks (its default) and without, same phones "
              "and arrivals; phones fresh = every phone a newcomer (a gateway without records), trusted = "
              f"records of {TRUSTED_PASSES} passed checks each in data_dir; verify share = shadow requests' slot-s / all attempts' (median of runs); fraud p99 "
              "phone s, median of runs [each run]; load avg as each run started")
        print(bl.table(["scenario", "load %", "phones", "runs", "checks", "slot-s checks", "verify share", "quarantined",
                        "fraud p99 with", "fraud p99 without", "ratio", "spread of runs", "load avg"],
                       [[x["scenario"], x["load_pct"], x["variant"], x["runs"], bl.fmt(x["checks"], 0), bl.fmt(x["slot_s_verify"], 1),
                         "n/a" if x["verify_share"] is None else f"{x['verify_share'] * 100:.2f}%",
                         x["quarantined"],
                         f"{bl.fmt(x['p99_on'], 1)} [{' '.join(bl.fmt(v, 1) for v in x['p99_on_runs'])}]",
                         f"{bl.fmt(x['p99_off'], 1)} [{' '.join(bl.fmt(v, 1) for v in x['p99_off_runs'])}]",
                         bl.fmt(x["ratio"], 3), "n/a" if x["noise"] is None else f"{x['noise'] * 100:.1f}%",
                         f"{min(x['loadavg']):.1f}-{max(x['loadavg']):.1f}"] for x in ab]))

    # Targets.
    verdict = []
    fg = [r for r in results if r["proxy"] == "fleetgate"]
    bad = [r for r in fg if r["has_capacity"] and r["failed"]]
    verdict.append(f"zero failed requests for fleetgate where the surviving fleet has capacity: "
                   f"{'met' if not bad else 'MISSED'} ({len([r for r in fg if r['has_capacity']])} cells; "
                   + (", ".join(f"{r['scenario']} {r['load_pct']}%: {r['fail_kinds']}" for r in bad) or "no failures") + ")")
    for r in fg:
        peers_ = [q for q in results if q["scenario"] == r["scenario"] and q["load_pct"] == r["load_pct"]
                  and q["proxy"] not in ("fleetgate", NOVERIFY, TRUSTED)]
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
    shares = [(r, r["hedging"].get("hedge_share")) for r in fg if "hedging" in r]
    if shares:
        known = [x for _, x in shares if x is not None]
        worst = max(known) if known else None
        verdict.append(f"hedges' extra phone work at most 5 % of slot-seconds: "
                       f"{'met' if known and len(known) == len(shares) and worst <= 0.05 else 'MISSED'} "
                       f"(worst cell {'n/a' if worst is None else f'{worst * 100:.2f}%'}; "
                       + ", ".join(f"{r['scenario']} {r['load_pct']}%: {'n/a' if x is None else f'{x * 100:.2f}%'}"
                                   for r, x in shares) + ")")
    vshares = [(r, r["hedging"].get("verify_share"), r["hedging"].get("quarantines")) for r in fg if "hedging" in r]
    if vshares:
        known = [x for _, x, _ in vshares if x is not None]
        worst = max(known) if known else None
        quar = sum(q or 0 for _, _, q in vshares)
        verdict.append(f"verification's phone work at most 3 % of slot-seconds: "
                       f"{'met' if known and len(known) == len(vshares) and worst <= 0.03 else 'MISSED'} "
                       f"(worst cell {'n/a' if worst is None else f'{worst * 100:.2f}%'}); "
                       f"honest phones quarantined: {quar:.0f} ({'met' if quar == 0 else 'MISSED'})")
    for x in ab:
        moved = None if x["ratio"] is None else abs(x["ratio"] - 1)
        noisy = moved is not None and x["noise"] is not None and moved > 0.05 and moved <= x["noise"]
        vs = "n/a" if x["verify_share"] is None else f"{x['verify_share'] * 100:.2f}%"
        spread = "n/a" if x["noise"] is None else f"{x['noise'] * 100:.1f}%"
        share_ok = "met" if x["verify_share"] is not None and x["verify_share"] <= 0.03 else "MISSED"
        p99_ok = "met" if moved is not None and moved <= 0.05 else "within noise" if noisy else "MISSED"
        verdict.append(f"verify {x['scenario']} {x['load_pct']}% ({x['variant']} records): checks spent {vs} of slot-s ({share_ok} <= 3 %); "
                       f"fraud p99 with/without {bl.fmt(x['ratio'], 3)} over {x['runs']} run(s) ({p99_ok} <= 5 %; "
                       f"runs spread {spread}); quarantined {x['quarantined']} "
                       f"({'met' if x['quarantined'] == 0 else 'MISSED'})")
    for r in fg:
        if "join" in r:
            j = r["join"]
            fs = j.get("first_sent_after_phone_s")
            verdict.append(f"join {r['load_pct']}%: the phone added without rates ({','.join(j['phones'])}) "
                           f"first served a request sent {bl.fmt(fs, 1)} phone-s after joining "
                           f"({'met' if fs is not None and fs <= 60 else 'MISSED'} <= 60 s); it served "
                           f"{j.get('served_after')} of the {j.get('sent_after')} sent after "
                           f"(f/s/c {'/'.join(str((j.get('by_class') or {}).get(c)) for c in ('fraud', 'scam', 'chat'))})")
        if "hung" in r:
            h = r["hung"]
            verdict.append(f"hung {r['load_pct']}%: requests that reached a hung phone answered within 2x their "
                           f"predicted time by fleetgate: {h['within_2x']}/{h['n']} "
                           f"({'met' if h['n'] and h['within_2x'] == h['n'] else 'MISSED'}; ratio p95 "
                           f"{bl.fmt(h['ratio_p95'], 2)}, max {bl.fmt(h['ratio_max'], 2)})")
        if "device" in r:
            g = r["device"]["by_group"]
            verdict.append(f"device {r['load_pct']}%: fleetgate served {g['low']['served']} requests on the "
                           f"low-battery phones (under the 10 % floor: expected 0) "
                           f"({'met' if g['low']['served'] == 0 else 'MISSED'})")
    for v in verdict:
        print("# target " + v)
    name = "b2_goodput_smoke" if a.smoke else ("b2_goodput_quick" if a.quick else "b2_goodput")
    if a.verify_ab:
        name += "_verify"
    out = bl.save_results("b2_goodput", name, {
           "params": {"scale": K, "window_s": a.window, "lead_s": a.lead,
                      "client_timeout_phone_s": a.client_timeout_sim, "seed": a.seed,
                      "loads": a.loads, "scenarios": scen, "cells": cells, "proxies": names,
                      "timeouts_wall_s": peers.default_timeouts(K)},
           "fleet": phones, "workload": classes, "capacity_req_per_phone_s": cap_sim,
           "wall_s": wall, "results": results, "verify_ab": ab, "verdict": verdict}, headers, rows)
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
