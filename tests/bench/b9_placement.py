#!/usr/bin/python3
"""B9 — placement by demand (issue #36, docs/placement.md): the same phones, the same
arrivals, with the gateway placing models on them and with each phone on a fixed model.

A B2-style fleet (fleet.py's flagship / midrange / budget classes, their rates and slots;
8 phones by default) serves two catalogue models: GUARD (a 0.8B, 560 MB: short messages,
300 prompt tokens and 16 out, about a second on a flagship) and REVIEW (a 9B, 5,700 MB:
reviews of 2,000 prompt tokens sharing a system prompt, 8 out, about 46 s on a flagship).
The sims run a 9B size-ratio times slower than the 0.8B (docs/sim.md) and report the
memory of their class (fake /proc/meminfo): an 8 GB budget phone cannot hold the 9B, so
placement never sends one there. A day is compressed into phases of phone seconds:

  day     guards at DAY_GUARD of what the whole fleet could answer on the 0.8B, a trickle
          of reviews (TRICKLE of what the phones able to hold the 9B could answer on it)
  night   reviews at NIGHT_REVIEW of that, guards at NIGHT_GUARD
  morning guards again as by day

Both cells start from the same split, the one an operator sizes for the whole day when
models are fixed: the fastest phones able to hold the 9B on it until the 9B's share of
the fleet covers the day's average review demand at 80 % (`--fixed-review N` overrides
the count). `placement` runs the gateway with `placement.enabled`; `fixed` without (the
phones stay where they started). Every request has a deadline (phone s: guards
GUARD_DEADLINE, reviews REVIEW_DEADLINE): its client waits that long and no longer.
Reported per cell, phase and model: sent, answered, answered within the deadline,
latency p50/p95 (phone s); the switches placement made; phones per model over time.

Times are phone seconds (wall x K, `--scale`); the gateway's placement settings are wall
seconds (its horizon, minimum stay and the download and load speeds are divided by K).

    tests/bench/b9_placement.py            # 8 phones, both cells, ~10 min
    tests/bench/b9_placement.py --smoke    # 4 phones, short phases, light load (~80 s)
Results: tests/bench/results/b9_placement.{json,csv}."""

import argparse
import asyncio
import json
import random
import sys
import threading
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as bl  # noqa: E402
import fleet  # noqa: E402

try:
    import aiohttp
    import b2_goodput as b2  # noqa: E402
except ImportError:  # pragma: no cover
    sys.exit("b9: needs aiohttp for /usr/bin/python3 (apt-get install -y python3-aiohttp)")

HOST = bl.HOST
TOKEN = "b9-admin-token-0123456789abcdef"
SECRET = "b9-fleet-secret-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MB = 1 << 20
GUARD, REVIEW = "guard-0.8b", "review-9b"
GUARD_BYTES, REVIEW_BYTES = 560 * MB, 5700 * MB
RATIO = REVIEW_BYTES / GUARD_BYTES              # the sim runs the 9B this much slower
GUARD_WC = {"name": "guard", "prompt_tokens": 300, "max_tokens": 16, "stream": False, "share": 1}
REVIEW_WC = {"name": "fraud", "prompt_tokens": 2000, "max_tokens": 8, "stream": False, "share": 1}
GUARD_DEADLINE, REVIEW_DEADLINE = 5.0, 300.0    # phone seconds
DAY_GUARD, NIGHT_GUARD, TRICKLE, NIGHT_REVIEW = 0.65, 0.10, 0.03, 0.80
LOAD_MB_S, FETCH_MB_S = 200, 50                 # the sims' (phone time)
# MemTotal of each class as its phones report it (kB): 8 GB phones cannot hold the 9B
MEM_KB = {"flagship-16gb": 15938355, "midrange-12gb": 11534336, "budget-8gb": 7654321}


def can_hold_review(p):
    usable = MEM_KB[p["class"]] / 1024
    usable -= max(2048, usable / 4)
    return usable >= REVIEW_BYTES / MB * 1.2 + 512


def capacity(p, wc, model):
    """Requests a phone answers a phone-second on model (all slots busy)."""
    f = 1 / RATIO if model == REVIEW else 1
    return p["slots"] / (wc["prompt_tokens"] / (p["prefill_tps"] * f) + wc["max_tokens"] / (p["decode_tps"] * f))


def phases(smoke):
    if smoke:
        return [("day", 100), ("night", 220), ("morning", 60)]
    return [("day", 400), ("night", 600), ("morning", 300)]


def fixed_split(phones, plan, n=None):
    """The phones on the 9B when models are fixed: the fastest able to hold it, until the
    9B's capacity covers the run's average review demand at 80 % (or n of them)."""
    able = sorted([p for p in phones if can_hold_review(p)], key=lambda p: -capacity(p, REVIEW_WC, REVIEW))
    c9 = sum(capacity(p, REVIEW_WC, REVIEW) for p in able)
    total = sum(d for _, d in plan)
    avg = sum(d * (NIGHT_REVIEW if name == "night" else TRICKLE) for name, d in plan) / total * c9
    out, got = [], 0.0
    for p in able:
        if (n is not None and len(out) >= n) or (n is None and got >= avg / 0.8):
            break
        out.append(p["id"])
        got += capacity(p, REVIEW_WC, REVIEW)
    return out


def arrivals(phones, plan, scale, seed, load):
    """[(wall s, wc, model)] for the whole run, the same for every cell."""
    cg = sum(capacity(p, GUARD_WC, GUARD) for p in phones)
    c9 = sum(capacity(p, REVIEW_WC, REVIEW) for p in phones if can_hold_review(p))
    rng = random.Random(seed)
    out, t0 = [], 0.0
    for name, dur in plan:
        day = name != "night"
        for model, wc, rate in ((GUARD, GUARD_WC, cg * (DAY_GUARD if day else NIGHT_GUARD) * load),
                                (REVIEW, REVIEW_WC, c9 * (TRICKLE if day else NIGHT_REVIEW) * load)):
            t = 0.0
            while rate > 0:
                t += rng.expovariate(rate)
                if t >= dur:
                    break
                out.append(((t0 + t) / scale, wc, model, name))
        t0 += dur
    out.sort(key=lambda x: x[0])
    return out, cg, c9


def body(rng, wc, model):
    return fleet.make_body(rng, wc, model=model)


async def drive(url, sched, bodies, scale):
    conn = aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True)
    recs = [dict() for _ in sched]
    async with aiohttp.ClientSession(connector=conn) as session:
        t0 = time.monotonic()
        tasks = []
        for i, (ts, wc, model, phase) in enumerate(sched):
            d = t0 + ts - time.monotonic()
            if d > 0:
                await asyncio.sleep(d)
            deadline = (GUARD_DEADLINE if model == GUARD else REVIEW_DEADLINE) / scale
            recs[i]["phase"] = phase
            recs[i]["model"] = model
            tasks.append(asyncio.create_task(b2.one_request(
                session, url, {"Content-Type": "application/json"}, bodies[i], wc, ts, t0, deadline,
                recs[i], f"b9-{i:05d}")))
        await asyncio.wait(tasks, timeout=REVIEW_DEADLINE / scale + 30)
        for tk in tasks:
            if not tk.done():
                tk.cancel()
    return recs


class Cell:
    """One gateway and its phones (two sim processes: those starting on each model)."""

    def __init__(self, procs, wd, phones, on_review, scale, place):
        self.procs, self.wd, self.scale = procs, wd, scale
        self.port, self.admin = bl.free_port(), bl.free_port()
        self.url = f"http://{HOST}:{self.port}"
        (wd / "data").mkdir(exist_ok=True)
        K = scale
        cfg = {
            "listen": f"{HOST}:{self.port}",
            "admin": {"listen": f"{HOST}:{self.admin}", "token": TOKEN},
            "upstream": {"allow_http": True, "allow_addresses": ["127.0.0.0/8"]},
            "health": {"interval_s": 0.5, "timeout_s": 2, "rise": 1, "fall": 3},
            "queue": {"max": 100000, "timeout_s": 3600},
            "scheduler": {"default_max_tokens": 16},
            "fleet": {"secret_env": "FG_SECRET", "heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 10},
            "data_dir": str(wd / "data"),
            "models": [
                {"name": GUARD, "url": f"http://{HOST}:9/{GUARD}.gguf", "sha256": "cd" * 32,
                 "size_bytes": GUARD_BYTES},
                {"name": REVIEW, "url": f"http://{HOST}:9/{REVIEW}.gguf", "sha256": "ab" * 32,
                 "size_bytes": REVIEW_BYTES},
            ],
            "placement": {"enabled": place, "interval_s": 0.5, "horizon_s": 300 / K, "min_stay_s": 60 / K,
                          "idle_s": 120 / K, "load_mb_s": LOAD_MB_S * K, "fetch_mb_s": FETCH_MB_S * K},
            "replicas": [],
            "log_level": "warn",
        }
        self.cfg = cfg
        (wd / "gw.json").write_text(json.dumps(cfg, indent=1))
        self.log = wd / "gw.log"
        self.gw = procs.spawn("gateway", [bl.gateway_bin(), "--config", str(wd / "gw.json")],
                              log=self.log, env={"FG_SECRET": SECRET})
        if not (bl.wait_port(self.port, proc=self.gw) and bl.wait_port(self.admin, proc=self.gw)):
            raise RuntimeError(f"b9: the gateway did not start: {self.log.read_text()[-2000:]}")
        for model, group in ((GUARD, [p for p in phones if p["id"] not in on_review]),
                             (REVIEW, [p for p in phones if p["id"] in on_review])):
            if not group:
                continue
            f = 1 / RATIO if model == REVIEW else 1
            entries = []
            for p in group:
                root = wd / f"root-{p['id']}"
                (root / "proc").mkdir(parents=True, exist_ok=True)
                kb = MEM_KB[p["class"]]
                (root / "proc/meminfo").write_text(f"MemTotal: {kb} kB\nMemFree: {kb // 3} kB\n"
                                                   f"MemAvailable: {kb // 2} kB\n")
                entries.append({"id": p["id"], "slots": p["slots"], "prefill_tps": round(p["prefill_tps"] * f, 3),
                                "decode_tps": round(p["decode_tps"] * f, 4), "n_ctx": p["n_ctx"],
                                "sysfs_root": str(root)})
            pf = wd / f"phones-{model}.json"
            pf.write_text(json.dumps(entries))
            procs.spawn(f"phones-{model}", [
                bl.agent_bin(), "--engine", "sim", "--listen", f"{HOST}:0", "--model", model,
                "--model-bytes", str(GUARD_BYTES if model == GUARD else REVIEW_BYTES),
                "--sim-load-mb-s", str(LOAD_MB_S), "--sim-fetch-mb-s", str(FETCH_MB_S),
                "--time-scale", str(K), "--phones-file", str(pf), "--log-level", "warn",
                "--gateway", self.url, "--public-url", f"http://{HOST}:{{port}}"],
                log=wd / f"phones-{model}.log", env={"FLEETGATE_FLEET_SECRET": SECRET})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.ready() < len(phones):
            time.sleep(0.3)
        if self.ready() < len(phones):
            raise RuntimeError(f"b9: {self.ready()} of {len(phones)} phones ready: {self.reps()}")

    def get(self, path):
        return requests.get(f"http://{HOST}:{self.admin}{path}", headers=AUTH, timeout=30).json()

    def reps(self):
        return self.get("/admin/v1/replicas")["replicas"]

    def ready(self):
        return sum(1 for r in self.reps() if r["state"] in ("ready", "busy"))


def sampler(cell, stop, out, t0):
    while not stop.is_set():
        try:
            pl = cell.get("/admin/v1/placements")
            out.append({"t_phone_s": round((time.monotonic() - t0) * cell.scale, 1),
                        "phones": {m["model"]: m["phones"] for m in pl["models"]},
                        "switching_to": {m["model"]: m["switching_to"] for m in pl["models"]}})
        except (requests.RequestException, ValueError, KeyError):
            pass
        stop.wait(1.0)


def run_cell(name, procs, phones, on_review, scale, sched, bodies):
    wd = bl.workdir(f"b9-{name.split('=')[0]}")
    cell = Cell(procs, wd, phones, on_review, scale, place=name.startswith("placement"))
    timeline, stop = [], threading.Event()
    t0 = time.monotonic()
    th = threading.Thread(target=sampler, args=(cell, stop, timeline, t0), daemon=True)
    th.start()
    recs = asyncio.run(drive(cell.url + "/v1/chat/completions", sched, bodies, scale))
    stop.set()
    th.join(10)
    pl = cell.get("/admin/v1/placements")
    events = [e for e in cell.get("/admin/v1/events?limit=1000").get("events", [])
              if e["type"].startswith("placement_switch")]
    procs.stop_all()
    return recs, timeline, pl, events


def summarise(recs, scale, plan):
    out = {}
    for ph in [n for n, _ in plan] + ["all"]:
        for model in (GUARD, REVIEW):
            rs = [r for r in recs if r.get("model") == model and (ph == "all" or r.get("phase") == ph)]
            dl = GUARD_DEADLINE if model == GUARD else REVIEW_DEADLINE
            lat = [r["latency"] * scale for r in rs if r.get("ok")]
            out[f"{ph}/{model}"] = {
                "sent": len(rs), "ok": len(lat),
                "in_deadline": sum(1 for x in lat if x <= dl),
                "p50": bl.pct(lat, 50), "p95": bl.pct(lat, 95),
                "fail_kinds": {k: sum(1 for r in rs if r.get("kind") == k) for k in
                               sorted({r.get("kind") for r in rs if r.get("kind")})}}
    rs = [r for r in recs if r.get("model")]
    out["all/all"] = {"sent": len(rs), "in_deadline": sum(v["in_deadline"] for k, v in out.items()
                                                          if k.startswith("all/"))}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phones", type=int, default=8, help="phones (fleet.py's B2 layout, spread)")
    ap.add_argument("--scale", type=float, default=5, help="time scale K of the sims")
    ap.add_argument("--load", type=float, default=1.0, help="every rate times this")
    ap.add_argument("--fixed-review", type=int, default=None, help="phones on the 9B at the start")
    ap.add_argument("--seed", type=int, default=9)
    ap.add_argument("--cells", default="placement,fixed",
                    help="placement, fixed (both from the split above), placement=ID+ID, fixed=ID+ID "
                         "(from those phones on the 9B)")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.phones, a.scale, a.load = 4, 10, 0.4
    procs = bl.Procs()
    bl.install_signal_handlers(procs)
    phones = fleet.build(a.phones)
    plan = phases(a.smoke)
    on_review = fixed_split(phones, plan, a.fixed_review)
    sched, cg, c9 = arrivals(phones, plan, a.scale, a.seed, a.load)
    rng = random.Random(a.seed + 1)
    bodies = [body(rng, wc, model) for _, wc, model, _ in sched]
    print(f"# {len(phones)} phones ({sum(p['slots'] for p in phones)} slots); on {REVIEW} at the start: "
          f"{', '.join(on_review)}; capacity {cg:.2f} guards or {c9:.3f} reviews a phone-second; "
          f"phases {plan} phone-s at K={a.scale:g}; {len(sched)} requests", flush=True)
    cells = {}
    for name in [c for c in a.cells.split(",") if c]:
        t = time.monotonic()
        split = name.split("=", 1)[1].split("+") if "=" in name else on_review
        if any(i not in {p["id"] for p in phones if can_hold_review(p)} for i in split):
            sys.exit(f"b9: {name}: a phone there is not in the fleet or cannot hold {REVIEW}")
        recs, timeline, pl, events = run_cell(name, procs, phones, split, a.scale, sched, bodies)
        s = summarise(recs, a.scale, plan)
        cells[name] = {"summary": s, "timeline": timeline, "placements": pl, "switch_events": events,
                       "on_review_at_start": split,
                       "requests": [[round(r.get("t_sched", 0) * a.scale, 2), r.get("model"), r.get("phase"),
                                     r.get("ok"), r.get("latency") and round(r["latency"] * a.scale, 3),
                                     r.get("kind"), r.get("replica")] for r in recs],
                       "switches": sum(m["switches"]["started"] for m in pl["models"]),
                       "wall_s": time.monotonic() - t}
        print(f"# {name}: {s['all/all']['in_deadline']} of {s['all/all']['sent']} within their deadlines; "
              f"switches {cells[name]['switches']} ({time.monotonic() - t:.0f} s)", flush=True)
    headers = ["cell", "phase", "model", "sent", "answered", "within deadline", "p50 s", "p95 s", "failed by kind"]
    rows = []
    for name, c in cells.items():
        for k, v in c["summary"].items():
            if k == "all/all":
                continue
            ph, model = k.split("/")
            rows.append([name, ph, model, v["sent"], v["ok"], v["in_deadline"], bl.fmt(v["p50"], 1),
                         bl.fmt(v["p95"], 1), " ".join(f"{x}:{n}" for x, n in v["fail_kinds"].items()) or "-"])
    print(bl.table(headers, rows))
    for fx in [n for n in cells if n.startswith("fixed")]:
        same = "placement" + fx[len("fixed"):]
        pl_name = same if same in cells else "placement" if "placement" in cells else None
        if not pl_name:
            continue
        p, f = cells[pl_name]["summary"], cells[fx]["summary"]
        for k in [x for x in p if x.startswith("all/")]:
            a_, b_ = p[k]["in_deadline"], f[k]["in_deadline"]
            print(f"# within deadline, {pl_name} / {fx}, {k}: {a_} / {b_} = {a_ / b_ if b_ else float('inf'):.2f}")
    for name, c in cells.items():
        for e in sorted(c["switch_events"], key=lambda e: e["id"]):
            if e["type"] == "placement_switch":
                print(f"#   {name}: {e.get('replica')} {e.get('from')} -> {e.get('to')}: {e.get('reason')}")
    out = bl.save_results("B9", "b9_placement_smoke" if a.smoke else "b9_placement", {
        "params": {"phones": a.phones, "scale": a.scale, "load": a.load, "seed": a.seed, "plan": plan,
                   "on_review": on_review, "guard_deadline_s": GUARD_DEADLINE,
                   "review_deadline_s": REVIEW_DEADLINE, "capacity_guard": cg, "capacity_review": c9},
        "fleet": phones, "cells": cells}, headers, rows)
    if a.smoke:
        p = cells.get("placement")
        bad = [n for n, c in cells.items() if c["summary"]["all/all"]["in_deadline"] == 0]
        if bad or not p or p["switches"] == 0:
            sys.exit(f"b9 smoke failed: nothing answered in {bad}, or no switch: "
                     f"{p and p['switches']}")
        print("b9 smoke ok")
    return 0 if out else 1


if __name__ == "__main__":
    sys.exit(main())
