#!/usr/bin/python3
"""Phone time idle while requests waited, by cause, from recorded planning passes.

Reads FLEETGATE_RECORD_PLANS files (docs/testing.md "Recorded plans", `.jsonl` or
`.jsonl.xz`). Each planning pass stands until the next one (at most --gap s); while
requests of the pass wait (planned not to start now), the slots left free count, at most
one a waiting request, in this order:

- kept for short work: free slots of the quick phones (planned prefill at or above the
  median of the model's usable phones: scheduler.c, quick_init), at most as many as the
  pass's requests keep (short_reserve, and a quarter of the quick slots), which longer
  work leaves to short work;
- left idle (faster phone): the other free slots, which the plan left idle while requests
  waited for faster phones (the queue as a whole, fill_idle, declined);
- held for an answer check: slots of phones that take no work while a check of them is
  undecided (verify.ahead: capacity 0 with no other reason the record shows);
- other limits: slots beyond a phone's capacity for the other reasons (probation, a phone
  without a record yet, its own readings, Redis shares).

Times are the gateway's (wall) seconds x --scale (a time-scaled sim fleet's phone
seconds). The B7 sampler's figure also counts the moments between an answer's end on the
phone and the next pass, which no record shows.

    tests/tools/plans_idle.py --scale 20 /tmp/b7/PID.jsonl
"""
import argparse
import collections
import json
import lzma
import statistics


def records(path):
    op = lzma.open if path.endswith(".xz") else open
    with op(path, "rt") as f:
        for line in f:
            o = json.loads(line)
            if o.get("kind") == "pass":
                yield o


def held_for_check(r):
    d = r["derived"]
    return (d["capacity"] == 0 and r["state"] == 0 and not r["drain"] and not r["probation"]
            and not r["trust_capped"] and r["dev_cap"] < 0 and not r["share_div"] and not r["remote_busy"])


def causes(recs, gap):
    acc = collections.Counter()
    recs = sorted(recs, key=lambda o: o["now"])
    for a, b in zip(recs, recs[1:]):
        dt = min((b["now"] - a["now"]) / 1000.0, gap)
        if dt <= 0:
            continue
        waiting = sum(1 for c in a["out"] if not c["now"])
        if not waiting:
            continue
        acc["waiting"] += dt
        R = a["replicas"]
        usable = [r["prefill_tps"] for r in R if r["derived"]["capacity"] > 0 and not r["derived"]["suspect"]]
        usable.sort()
        median = usable[len(usable) // 2] if usable else 0
        taken = collections.Counter(c["replica"] for c in a["out"] if c["replica"] >= 0 and c["now"])
        quick = slower = check = other = q_slots = 0
        for j, r in enumerate(R):
            if r["state"] != 0:
                continue
            cap, inflight = r["derived"]["capacity"], len(r["leases"])
            free = max(0, cap - inflight - taken[j])
            if r["prefill_tps"] >= median and cap > 0 and not r["derived"]["suspect"]:
                quick += free
                q_slots += cap
            else:
                slower += free
            beyond = max(0, r["slots"] - max(cap, inflight))
            if held_for_check(r):
                check += beyond
            else:
                other += beyond
        # at most min(short_reserve, a quarter of the quick slots) of them are kept; the
        # others were left idle as the slower phones' are
        keep = min(max((q.get("short_reserve", 0) for q in a["reqs"]), default=0), q_slots // 4)
        slower += max(0, quick - keep)
        quick = min(quick, keep)
        left = waiting
        for name, n in (("kept for short work", quick), ("left idle (faster phone)", slower),
                        ("held for an answer check", check), ("other limits", other)):
            k = min(n, left)
            acc[name] += dt * k
            left -= k
    return acc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--scale", type=float, default=1.0, help="phone seconds per gateway second")
    ap.add_argument("--gap", type=float, default=1.0, help="the longest a pass stands for (gateway s)")
    a = ap.parse_args()
    for path in a.files:
        acc = causes(list(records(path)), a.gap)
        total = sum(v for k, v in acc.items() if k != "waiting")
        print(f"{path}: requests waited {acc['waiting'] * a.scale:,.0f} s; idle slot time while they waited "
              f"{total * a.scale:,.0f} s")
        for k in ("kept for short work", "left idle (faster phone)", "held for an answer check", "other limits"):
            v = acc.get(k, 0.0)
            print(f"  {k:26} {v * a.scale:8,.0f} s  {100 * v / total if total else 0:5.1f} %")


if __name__ == "__main__":
    main()
