#!/usr/bin/python3
"""Keep a bounded, varied sample of recorded plans (FLEETGATE_RECORD_PLANS files) for the
unit suite's replay (tests/unit/test_planreplay.c, tests/unit/plans/README.md).

    plans_sample.py --out tests/unit/plans/NAME.jsonl --max-bytes 600000 FILE...
    plans_sample.py --out tests/unit/plans/NAME.jsonl --contiguous 150 FILE...

Every hedge and move record is kept (they are few). Then either the records that differ
most from what was kept: passes of each (requests, replicas, usable, busy, kinds of
request) shape, the largest first, and predictions likewise, in the files' order within a
shape, until max-bytes; or (--contiguous N) the N consecutive records of each file that
plan the most requests, as the gateway made them one after the other (consecutive records
share most of their replicas and fingerprints, so xz keeps them small). Deterministic: the
same files give the same sample. Compress the result with `xz -9`."""

import argparse
import json
import sys


def shape(rec):
    reps = rec["replicas"]
    usable = sum(1 for r in reps if r["derived"]["capacity"] > 0)
    busy = sum(1 for r in reps if r["leases"])
    hot = sum(1 for r in reps if r["dev_hot"])
    suspect = sum(1 for r in reps if r["derived"]["suspect"])
    cached = sum(1 for r in reps for s in r["pc"]["slots"] if s["blocks"])
    reqs = rec["reqs"]
    flags = (sum(1 for q in reqs if q["batch"]), sum(1 for q in reqs if q["take_free"]),
             sum(1 for q in reqs if q["short_reserve"] > 0), sum(1 for q in reqs if q["avoid"] >= 0),
             sum(1 for q in reqs if q["blocks"]))
    outs = rec.get("out", [])
    now = sum(1 for o in outs if o["now"])
    waits = sum(1 for o in outs if o["replica"] >= 0 and not o["now"])
    return (rec["kind"], min(len(reqs), 64), len(reps), usable, min(busy, 8), hot, suspect,
            min(cached, 8), flags, now, waits)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-bytes", type=int, default=600000)
    ap.add_argument("--contiguous", type=int, default=0)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    lines = []
    if a.contiguous:
        keep = []
        for f in a.files:
            with open(f) as fh:
                recs = [line.strip() for line in fh if line.strip()]
            sizes = [len(json.loads(l)["reqs"]) for l in recs]
            n = min(a.contiguous, len(recs))
            best, at, cur = -1, 0, sum(sizes[:n])
            for i in range(0, len(recs) - n + 1):
                if i:
                    cur += sizes[i + n - 1] - sizes[i - 1]
                if cur > best:
                    best, at = cur, i
            window = set(range(at, at + n))
            for i, l in enumerate(recs):
                if i in window or json.loads(l)["kind"] in ("hedge", "move"):
                    keep.append(l)
        with open(a.out, "w") as fh:
            for l in keep:
                fh.write(l + "\n")
        kinds = {}
        for l in keep:
            k = json.loads(l)["kind"]
            kinds[k] = kinds.get(k, 0) + 1
        print(f"{a.out}: {len(keep)} records, {sum(len(l) + 1 for l in keep)} bytes, {kinds}",
              file=sys.stderr)
        return
    for f in a.files:
        with open(f) as fh:
            for line in fh:
                line = line.strip()
                if line:
                    lines.append(line)
    keep, seen, size = [], set(), 0
    recs = [(json.loads(l), l) for l in lines]
    # hedges and moves first, then one record of each shape (largest request count
    # first), then a second of each, and so on
    first = [x for x in recs if x[0]["kind"] in ("hedge", "move")]
    rest = [x for x in recs if x[0]["kind"] not in ("hedge", "move")]
    by_shape = {}
    for rec, line in rest:
        by_shape.setdefault(shape(rec), []).append(line)
    order = sorted(by_shape, key=lambda s: (-s[1], s))
    rounds = []
    depth = max((len(v) for v in by_shape.values()), default=0)
    for k in range(depth):
        for s in order:
            if k < len(by_shape[s]):
                rounds.append(by_shape[s][k])
    for line in [l for _, l in first] + rounds:
        if line in seen:
            continue
        if size + len(line) + 1 > a.max_bytes:
            continue
        seen.add(line)
        keep.append(line)
        size += len(line) + 1
    # in recorded order, so a reader follows the runs as they went
    index = {l: i for i, l in enumerate(lines)}
    keep.sort(key=lambda l: index[l])
    with open(a.out, "w") as fh:
        for l in keep:
            fh.write(l + "\n")
    kinds = {}
    for l in keep:
        k = json.loads(l)["kind"]
        kinds[k] = kinds.get(k, 0) + 1
    print(f"{a.out}: {len(keep)} of {len(lines)} records, {size} bytes, {kinds}", file=sys.stderr)


if __name__ == "__main__":
    main()
