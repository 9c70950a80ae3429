#!/usr/bin/python3
"""B5 — a batch of reviews on a phone fleet that also serves interactive traffic.

The B2 fleet (fleet.py: 24 simulated phones, 54 slots, --time-scale K) serves B2's
interactive mix (fraud reviews, scam filters, streamed chats; Poisson arrivals) at 50 %
of its capacity the whole time. On top of it, 2,000 review lines that share long system
prompts (3 groups, interleaved in the input: line i belongs to group i mod 3) and each
carry a short distinct case, are run in three ways:

  nginx    a client script sends the lines at a fixed concurrency through nginx (upstream =
           the phones, nginx configured as in B2); the interactive traffic goes through
           nginx too: what an operator without fleetgate has
  plain    the same script through fleetgate's /v1/chat/completions with
           `x-fleetgate-priority: batch`; interactive traffic through fleetgate
  batch    fleetgate's Batch API: POST /v1/files (multipart, purpose=batch), POST
           /v1/batches, GET /v1/batches/{id} until completed, GET the output file
  direct   (not run unless named) the script through fleetgate at the interactive
           priority: its routing beside nginx's weighted round-robin, request for request

plus the interactive traffic alone through each proxy (base-nginx, base-fleetgate).
Each run gets a fresh fleet and a fresh proxy, and the same interactive arrivals (same
seed). Measured: interactive latency p99 while the batch runs vs without it (requests
sent while the batch ran; baseline: sent after the same warm-up), the batch's makespan
(first byte sent to last answer in hand), how busy the phones were during it (the sims'
/metrics: prefill + decode seconds, plus the prefill in progress read from /slots, over
slots x duration), and the prefix-cache hit rate of the batch lines (sum cache_n / sum
(cache_n + prompt_n) from the answers' `timings`). Times are phone seconds (wall x K).

    tests/bench/b5_batch.py            # 2,000 lines, 5 runs (~6 min)
    tests/bench/b5_batch.py --quick    # 500 lines (~3 min)
    tests/bench/b5_batch.py --smoke    # 60 lines on 6 phones, every run (~40 s): does it work
    tests/bench/b5_batch.py --cache-mode hybrid [--shared-in user]
                                       # the sims keep b10587's checkpoints (Qwen3.5)
    tests/bench/b5_batch.py --cache-mode hybrid --shared-in none --load 0 \
        --runs nginx,direct,plain      # every line its own instructions: nothing to
                                       # reuse; fleetgate's routing beside round-robin
    tests/bench/b5_batch.py ... --verify trusted|off
                                       # answer checks as in a fleet in service (every
                                       # phone with a record), or none; default fresh
Results: tests/bench/results/b5_batch.{json,csv} (_hybrid_system, _full_user... beside)."""

import argparse
import asyncio
import hashlib
import json
import random
import re
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
    sys.exit("b5: needs aiohttp for /usr/bin/python3 (apt-get install -y python3-aiohttp)")
import b2_goodput as b2  # noqa: E402  (its interactive request: one_request)

RUNS = ("base-nginx", "nginx", "base-fleetgate", "plain", "direct", "batch")
PROXY_OF = {"base-nginx": "nginx", "nginx": "nginx", "base-fleetgate": "fleetgate",
            "plain": "fleetgate", "direct": "fleetgate", "batch": "fleetgate"}
GROUPS = (("card-fraud", "You review card transactions flagged as possible fraud."),
          ("refund-abuse", "You review refund and chargeback claims for abuse."),
          ("account-takeover", "You review logins and account changes for takeover."))
TERMINAL = ("completed", "failed", "expired", "cancelled")


# ------------------------------------------------------------------------------ the batch

def system_prompt(g, tokens, seed):
    """Group g's shared instructions: a distinct opening (so groups share no prefix
    beyond the chat template) and about `tokens` tokens in all."""
    name, head = GROUPS[g % len(GROUPS)]
    head = f"[{name} #{g}] {head} Read the case and answer with one line: RISK_LEVEL: 1-5. Policy: "
    rng = random.Random(seed * 31 + g)
    return head + fleet.text_of_tokens(rng, max(1, tokens - len(head) // 4))


def make_lines(n, groups, sys_tokens, user_tokens, max_tokens, seed, shared_in="system"):
    """n request bodies (dicts) and the group of each; line i is in group i mod groups.
    shared_in "user": the shared instructions open the user message instead of being a
    system message (where a hybrid engine's checkpoints fall differs); "none": every line
    has instructions of its own (as long, in a system message), its own group: prompts
    that share nothing but the chat template's first characters."""
    if shared_in == "none":
        groups = n
    systems = [system_prompt(g, sys_tokens, seed) for g in range(groups)]
    rng = random.Random(seed)
    bodies, grp = [], []
    for i in range(n):
        g = i % groups
        user = f"Case {i:05d}: " + fleet.text_of_tokens(rng, max(1, user_tokens - 3))
        msgs = ([{"role": "system", "content": systems[g]}, {"role": "user", "content": user}]
                if shared_in in ("system", "none") else [{"role": "user", "content": systems[g] + "\n\n" + user}])
        bodies.append({"model": fleet.MODEL, "max_tokens": max_tokens, "messages": msgs})
        grp.append(g)
    return bodies, grp


def chatml(body):
    """The prompt as the sim renders it (proto/oai.c): what its cache compares."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
                   for m in body["messages"]) + "<|im_start|>assistant\n"


def ideal_cache(bodies, grp):
    """Per line, the tokens cached if it found its group's shared prefix in a slot's
    cache (the group's common prefix / 4, at most prompt - 1, as the sim counts), and
    its prompt tokens."""
    texts = [chatml(b) for b in bodies]
    lcp = {}
    for g in set(grp):
        s = sorted(t for t, h in zip(texts, grp) if h == g)
        lcp[g] = min((_lcp(s[k], s[k + 1]) for k in range(len(s) - 1)), default=0)
    n = [-(-len(t) // 4) for t in texts]
    return [min(lcp[g] // 4, k - 1) for g, k in zip(grp, n)], n


def _lcp(a, b):
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def timings_of(j):
    """(cache_n, prompt_n) from an answer's llama-server timings (usage as a fallback)."""
    t = (j or {}).get("timings") or {}
    if "cache_n" in t and "prompt_n" in t:
        return int(t["cache_n"]), int(t["prompt_n"])
    u = (j or {}).get("usage") or {}
    c = ((u.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0
    if "prompt_tokens" in u:
        return int(c), int(u["prompt_tokens"]) - int(c)
    return None


# ------------------------------------------------------------------------------ the fleet's busy time

_METRIC = re.compile(r"^llamacpp:(\w+) ([0-9.eE+-]+)$", re.M)


async def _get(session, url, timeout=2.0):
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            return r.status, await r.read()
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None, b""


async def metrics_of(session, ph):
    st, data = await _get(session, f"http://{bl.HOST}:{ph['port']}/metrics")
    if st != 200:
        return None
    return {k: float(v) for k, v in _METRIC.findall(data.decode(errors="replace"))}


async def busy_snapshot(session, phones, K):
    """Per phone: slot-seconds (wall) spent prefilling and decoding so far. The sim adds
    a prefill to its counter when it ends, so the part of each prefill in progress is
    added from /slots (tokens processed so far / the wall-clock prefill rate)."""
    async def one(ph):
        m, (st, data) = await asyncio.gather(metrics_of(session, ph),
                                             _get(session, f"http://{bl.HOST}:{ph['port']}/slots"))
        if m is None:
            return None
        busy = m.get("prompt_seconds_total", 0.0) + m.get("tokens_predicted_seconds_total", 0.0)
        if st == 200:
            try:
                for s in json.loads(data):
                    if not s.get("is_processing"):
                        continue
                    todo = s.get("n_prompt_tokens", 0) - s.get("n_prompt_tokens_cache", 0)
                    done = s.get("n_prompt_tokens_processed", 0)
                    if done < todo:
                        busy += done / (ph["prefill_tps"] * K)
            except (ValueError, TypeError, AttributeError):
                pass
        return busy
    t_a = time.monotonic()
    vals = await asyncio.gather(*(one(p) for p in phones))
    t_b = time.monotonic()
    return {"t": (t_a + t_b) / 2, "busy": {p["id"]: v for p, v in zip(phones, vals)}}


def busy_between(a, b, phones):
    """Busy fraction overall and per phone class between two snapshots."""
    dur = b["t"] - a["t"]
    per, cls = {}, {}
    for p in phones:
        x, y = a["busy"].get(p["id"]), b["busy"].get(p["id"])
        if x is None or y is None or dur <= 0:
            continue
        per[p["id"]] = (y - x) / (p["slots"] * dur)
        c = cls.setdefault(fleet.SHORT[p["class"]], [0.0, 0])
        c[0] += y - x
        c[1] += p["slots"]
    slots = sum(p["slots"] for p in phones if p["id"] in per)
    tot = sum((b["busy"][p["id"]] - a["busy"][p["id"]]) for p in phones if p["id"] in per)
    return {"duration_wall_s": dur,
            "all": tot / (slots * dur) if slots and dur > 0 else None,
            "by_class": {k: v[0] / (v[1] * dur) for k, v in cls.items()} if dur > 0 else {},
            "per_phone": per}


async def sampler(session, phones, t0, stop, out, every):
    """Every `every` wall seconds: slots busy and requests waiting on the phones."""
    while not stop.is_set():
        ms = await asyncio.gather(*(metrics_of(session, p) for p in phones))
        out.append([round(time.monotonic() - t0, 3),
                    int(sum((m or {}).get("requests_processing", 0) for m in ms)),
                    int(sum((m or {}).get("requests_deferred", 0) for m in ms))])
        try:
            await asyncio.wait_for(stop.wait(), every)
        except asyncio.TimeoutError:
            pass


# ------------------------------------------------------------------------------ interactive traffic

def interactive_body(seed, i, wc):
    return fleet.make_body(random.Random(seed * 1000003 + i), wc)


async def drive_interactive(session, url, headers, sched, seed, t0, stop, timeout_s, recs):
    """B2's open-loop arrivals until `stop` is set; then waits for the ones sent."""
    tasks = []
    for i, (ts, wc) in enumerate(sched):
        if stop.is_set():
            break
        d = t0 + ts - time.monotonic()
        if d > 0:
            try:
                await asyncio.wait_for(stop.wait(), d)
                break
            except asyncio.TimeoutError:
                pass
        rec = {}
        recs.append(rec)
        tasks.append(asyncio.create_task(b2.one_request(session, url, headers,
                                                        interactive_body(seed, i, wc), wc, ts,
                                                        t0, timeout_s, rec)))
    if tasks:
        await asyncio.wait(tasks, timeout=timeout_s + 30)
        for tk in tasks:
            if not tk.done():
                tk.cancel()


def interactive_stats(recs, lo, hi, K):
    """Latency stats (phone s) of the interactive requests sent in [lo, hi) wall s."""
    sel = [r for r in recs if "t_send" in r and lo <= r["t_send"] < hi]
    ok = [r for r in sel if r.get("ok")]
    fails = {}
    for r in sel:
        if not r.get("ok"):
            k = r.get("kind") or "unfinished"
            fails[k] = fails.get(k, 0) + 1
    lat = [r["latency"] * K for r in ok]
    out = {"n": len(sel), "ok": len(ok), "failed": len(sel) - len(ok), "fail_kinds": fails,
           "p50": bl.pct(lat, 50), "p95": bl.pct(lat, 95), "p99": bl.pct(lat, 99), "classes": {}}
    for c in ("fraud", "scam", "chat"):
        cl = [r["latency"] * K for r in ok if r["cls"] == c]
        s = {"ok": len(cl), "p50": bl.pct(cl, 50), "p99": bl.pct(cl, 99)}
        if c == "chat":
            tt = [r["ttft"] * K for r in ok if r["cls"] == c and r.get("ttft") is not None]
            s["ttft_p99"] = bl.pct(tt, 99)
        out["classes"][c] = s
    return out


# ------------------------------------------------------------------------------ the batch, three ways

async def run_script(session, url, headers, bodies, conc, timeout_s, t0):
    """The client script: `conc` workers, each sending the next line when its last one is
    answered. Returns per-line records and (start, end) wall s from t0."""
    recs = [None] * len(bodies)
    nxt = iter(range(len(bodies)))
    data = [json.dumps(b).encode() for b in bodies]

    async def worker():
        for i in nxt:
            t_a = time.monotonic()
            rec = {"i": i, "t_send": t_a - t0, "status": None, "ok": False}
            try:
                async with session.post(url, data=data[i], headers=headers,
                                        timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                    rec["status"] = r.status
                    raw = await r.read()
                if rec["status"] == 200:
                    j = json.loads(raw)
                    rec["timings"] = timings_of(j)
                    rec["replica"] = j.get("system_fingerprint")
                    rec["ok"] = bool(j.get("choices"))
                    if not rec["ok"]:
                        rec["kind"] = "bad_body"
                else:
                    rec["kind"] = f"http_{rec['status']}"
            except asyncio.TimeoutError:
                rec["kind"] = "client_timeout"
            except (aiohttp.ClientError, ValueError) as e:
                rec["kind"] = type(e).__name__
            rec["t_done"] = time.monotonic() - t0
            recs[i] = rec

    start = time.monotonic() - t0
    await asyncio.gather(*(worker() for _ in range(conc)))
    return recs, start, time.monotonic() - t0


class BatchApiError(RuntimeError):
    pass


async def run_batch_api(session, base, headers, bodies, t0, poll_s, max_wall):
    """OpenAI's Batch API as its Python client uses it. Returns per-line records (from
    the output and error files), (start, end) wall s from t0, and the phases."""
    lines = b"".join(json.dumps({"custom_id": f"line-{i:05d}", "method": "POST",
                                 "url": "/v1/chat/completions", "body": b},
                                separators=(",", ":")).encode() + b"\n"
                     for i, b in enumerate(bodies))
    ph = {"input_bytes": len(lines), "statuses": []}
    start = time.monotonic() - t0
    fd = aiohttp.FormData()
    fd.add_field("purpose", "batch")
    fd.add_field("file", lines, filename="b5-reviews.jsonl", content_type="application/jsonl")
    async with session.post(base + "/v1/files", data=fd, headers=headers) as r:
        body = await r.read()
        if r.status != 200:
            hint = (" (the gateway's upload limit: batch.max_file_bytes, and limits.max_body_bytes "
                    "where it caps uploads too; --fleetgate-config can raise it)") if r.status == 413 else ""
            raise BatchApiError(f"POST /v1/files ({len(lines)} bytes): {r.status} {body[:300]!r}{hint}")
        f = json.loads(body)
    ph["t_uploaded"] = time.monotonic() - t0
    ph["file"] = f
    async with session.post(base + "/v1/batches", headers=headers,
                            json={"input_file_id": f["id"], "endpoint": "/v1/chat/completions",
                                  "completion_window": "24h"}) as r:
        body = await r.read()
        if r.status != 200:
            raise BatchApiError(f"POST /v1/batches: {r.status} {body[:300]!r}")
        b = json.loads(body)
    ph["t_created"] = time.monotonic() - t0
    ph["statuses"].append([round(ph["t_created"], 3), b.get("status"), b.get("request_counts")])
    bid = b["id"]
    deadline = time.monotonic() + max_wall
    last = None
    while b.get("status") not in TERMINAL:
        if time.monotonic() > deadline:
            async with session.post(f"{base}/v1/batches/{bid}/cancel", headers=headers) as r:
                await r.read()
            raise BatchApiError(f"batch {bid} not done after {max_wall:.0f} s wall: {b}")
        await asyncio.sleep(poll_s)
        async with session.get(f"{base}/v1/batches/{bid}", headers=headers) as r:
            body = await r.read()
            if r.status != 200:
                raise BatchApiError(f"GET /v1/batches/{bid}: {r.status} {body[:300]!r}")
            b = json.loads(body)
        now = round(time.monotonic() - t0, 3)
        key = (b.get("status"), json.dumps(b.get("request_counts"), sort_keys=True))
        if key != last:
            ph["statuses"].append([now, b.get("status"), b.get("request_counts")])
            last = key
        if b.get("status") == "in_progress" and "t_in_progress" not in ph:
            ph["t_in_progress"] = now
    ph["t_terminal"] = time.monotonic() - t0
    ph["batch"] = b
    if b.get("status") != "completed":
        raise BatchApiError(f"batch {bid} ended {b.get('status')}: {b.get('errors')}")
    recs = [None] * len(bodies)
    for key in ("output_file_id", "error_file_id"):
        fid = b.get(key)
        if not fid:
            continue
        async with session.get(f"{base}/v1/files/{fid}/content", headers=headers) as r:
            body = await r.read()
            if r.status != 200:
                raise BatchApiError(f"GET /v1/files/{fid}/content: {r.status} {body[:300]!r}")
        ph[key.replace("_id", "_bytes")] = len(body)
        for ln in body.splitlines():
            if not ln.strip():
                continue
            o = json.loads(ln)
            i = int(o["custom_id"].split("-")[1])
            resp = o.get("response") or {}
            rec = {"i": i, "status": resp.get("status_code"), "ok": False, "from": key}
            j = resp.get("body") if isinstance(resp.get("body"), dict) else None
            if o.get("error"):
                rec["kind"] = "error:" + str((o["error"] or {}).get("code"))
            elif rec["status"] == 200 and j and j.get("choices"):
                rec["ok"] = True
                rec["timings"] = timings_of(j)
                rec["replica"] = j.get("system_fingerprint")
            else:
                rec["kind"] = f"http_{rec['status']}"
            if recs[i] is not None:
                rec["kind"] = "duplicate"
                rec["ok"] = False
            recs[i] = rec
    end = time.monotonic() - t0
    return recs, start, end, ph


# ------------------------------------------------------------------------------ one run

def gateway_batch_extra(wd):
    d = Path(wd) / "batch-data"
    d.mkdir(parents=True, exist_ok=True)
    return {"data_dir": str(d), "batch": {"window": 0}}


def batch_api_supported(wd):
    """Whether this fleetgate binary knows the Batch API's configuration keys."""
    import subprocess
    cfg = Path(wd) / "probe.json"
    cfg.write_text(json.dumps({"listen": [{"address": "127.0.0.1:1"}],
                               "replicas": [{"id": "x", "url": "http://127.0.0.1:2",
                                             "models": ["m"]}],
                               "upstream": {"allow_http": True,
                                            "allow_addresses": ["127.0.0.0/8"]},
                               **gateway_batch_extra(wd)}))
    r = subprocess.run([bl.gateway_bin(), "--check-config", str(cfg)], capture_output=True,
                       text=True, timeout=30)
    return r.returncode == 0, (r.stdout + r.stderr).strip()[-400:]


def _epoch(ts):
    """An access-log timestamp (UTC, ms) as Unix seconds."""
    import calendar
    base, _, frac = ts.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(base, "%Y-%m-%dT%H:%M:%S")) + float("0." + (frac or "0"))


def gateway_batch_log(path, t0_epoch):
    """From fleetgate's access log: the batch-priority requests per phone, what the
    gateway expected to find cached, and when each waited in the gateway's queue
    (wall s from t0: queued = logged - duration, dispatched = queued + queue wait)."""
    per, n, cached, waited, spans = {}, 0, 0, [], []
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return None
    for ln in text.splitlines():
        if '"msg":"request"' not in ln or '"priority":"batch"' not in ln:
            continue
        try:
            o = json.loads(ln)
        except ValueError:
            continue
        n += 1
        per[o.get("replica")] = per.get(o.get("replica"), 0) + 1
        cached += o.get("cached_tokens") or 0
        if o.get("queue_wait_ms") is not None:
            waited.append(o["queue_wait_ms"])
            try:
                q = _epoch(o["ts"]) - o["duration_ms"] / 1000.0 - t0_epoch
                spans.append((q, q + o["queue_wait_ms"] / 1000.0))
            except (KeyError, ValueError, TypeError):
                pass
    return {"requests": n, "per_replica": per, "cached_tokens_estimated": cached,
            "queue_wait_ms_p50": bl.pct(waited, 50), "queue_wait_ms_max": max(waited or [0]),
            "queued_spans": spans}


def idle_while_queued(samples, spans, slots, lo, hi):
    """Over the per-second samples in [lo, hi]: the share of them in which batch lines
    waited in the gateway's queue while slots were idle, and the mean idle slots and
    waiting lines then."""
    sel = [x for x in samples if lo <= x[0] <= hi]
    hit, idle, wait = 0, 0, 0
    for t, busy, _ in sel:
        w = sum(1 for a, b in spans if a <= t < b)
        if w and busy < slots:
            hit += 1
            idle += slots - busy
            wait += w
    return {"samples": len(sel), "share": hit / len(sel) if sel else None,
            "idle_slots_mean": idle / hit if hit else 0, "waiting_mean": wait / hit if hit else 0}


def tenant_keys(mode):
    """--tenants: the batch's key ("reviews") and the interactive traffic's ("app"); with
    `shared` both name one cache scope, with `apart` each key is its own (the default)."""
    keys = [{"name": n, "key_sha256": hashlib.sha256(f"b5-{n}-key".encode()).hexdigest()}
            for n in ("reviews", "app")]
    if mode == "shared":
        for k in keys:
            k["cache_scope"] = "one-team"
    return keys


def tenant_auth(a, pname, who):
    if a.tenants == "none" or pname != "fleetgate":
        return {}
    return {"Authorization": f"Bearer b5-{who}-key"}


def run_one(run, a, phones, bodies, grp, ideal, wd):
    K = a.scale
    procs = bl.Procs()
    rwd = wd / run
    rwd.mkdir(parents=True, exist_ok=True)
    t_fleet = time.monotonic()
    fl = fleet.start_fleet(procs, rwd, phones, K, cpu=None)
    t = peers.default_timeouts(K)
    pname = PROXY_OF[run]
    sub = rwd / pname
    sub.mkdir(parents=True, exist_ok=True)
    if pname == "nginx":
        px = peers.start_nginx(procs, sub, fl, t)
    else:
        # the gateway's time settings are wall-clock seconds: its default batch_borrow_s
        # (1 s on a real phone) is 1/K s against sims K times faster than real time
        extra = peers.merge_config({"scheduler": {"batch_borrow_s": 1.0 / K}},
                                   json.loads(a.fleetgate_config) if a.fleetgate_config else {})
        if run == "batch":
            extra = peers.merge_config(extra, gateway_batch_extra(sub))
        if a.verify == "trusted":
            # the records a gateway keeps across restarts (data_dir/verify.json), as for a
            # fleet in service: every phone passed B2's TRUSTED_PASSES checks in a row
            dd = Path(extra.get("data_dir") or sub / "data")
            dd.mkdir(parents=True, exist_ok=True)
            now_ms = int(time.time() * 1000)
            (dd / "verify.json").write_text(json.dumps({"version": 1, "phones": [
                {"id": p["id"], "answers": 2 * b2.TRUSTED_PASSES, "passed": b2.TRUSTED_PASSES,
                 "in_row": b2.TRUSTED_PASSES, "last_pass_at": now_ms} for p in phones]}))
            extra["data_dir"] = str(dd)
        elif a.verify == "off":
            extra = peers.merge_config(extra, {"verify": {"enabled": False}})
        if a.tenants != "none":
            extra = peers.merge_config(extra, {"api_keys": tenant_keys(a.tenants)})
        px = peers.start_fleetgate(procs, sub, fl, t, fleet.MODEL, scale=K, extra=extra or None)
    bl.keep_config("b5", px.config, f"{run}-{Path(px.config).name}")
    d = t_fleet + a.lead - time.monotonic()
    if d > 0:
        time.sleep(d)
    cap = fleet.capacity(fl)
    sched = (fleet.schedule(cap * K * a.load / 100.0, a.warm + a.max_batch_wall, a.seed)
             if a.load > 0 else [])  # --load 0: the batch alone
    res = {"run": run, "proxy": pname}
    t0_epoch = [0.0]

    def proc_cpu():
        """CPU seconds so far: the proxy, all the sims, this client."""
        import os
        tm = os.times()
        return {"proxy": sum(bl.cpu_ticks(q) or 0 for q in bl.tree_pids(px.proc.pid)),
                "sims": sum(bl.cpu_ticks(q["proc"].pid) or 0 for q in fl),
                "client": tm.user + tm.system}

    async def main():
        conn = lambda: aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True)
        async with aiohttp.ClientSession(connector=conn()) as si, \
                aiohttp.ClientSession(connector=conn()) as sb, \
                aiohttp.ClientSession(connector=conn()) as sm:
            t0 = time.monotonic()
            t0_epoch[0] = time.time()
            stop_i, stop_s = asyncio.Event(), asyncio.Event()
            irecs, samples = [], []
            hdr_i = {"Content-Type": "application/json", **px.headers, **tenant_auth(a, pname, "app")}
            hdr_own = {**px.headers, **tenant_auth(a, pname, "reviews")}
            ti = asyncio.create_task(drive_interactive(si, px.url() + "/v1/chat/completions",
                                                       hdr_i, sched, a.seed, t0, stop_i,
                                                       a.client_timeout_sim / K, irecs))
            ts = asyncio.create_task(sampler(sm, fl, t0, stop_s, samples, a.sample_every))
            await asyncio.sleep(a.warm)
            snap_a = await busy_snapshot(sm, fl, K)
            snap_a["cpu"] = proc_cpu()
            brecs, ph, err = None, None, None
            if run.startswith("base-"):
                await asyncio.sleep(a.base_window)
                b_start, b_end = a.warm, time.monotonic() - t0
            elif run == "batch":
                try:
                    brecs, b_start, b_end, ph = await run_batch_api(
                        sb, px.url(), hdr_own, bodies, t0, a.poll, a.max_batch_wall)
                except (BatchApiError, aiohttp.ClientError, asyncio.TimeoutError,
                        ValueError, KeyError) as e:
                    err = f"{type(e).__name__}: {e}"
                    b_start, b_end = a.warm, time.monotonic() - t0
            else:
                hdr_b = {"Content-Type": "application/json", **hdr_own}
                if run == "plain":
                    hdr_b["x-fleetgate-priority"] = "batch"
                brecs, b_start, b_end = await run_script(
                    sb, px.url() + "/v1/chat/completions", hdr_b, bodies, a.concurrency,
                    a.client_timeout_sim / K, t0)
            snap_b = await busy_snapshot(sm, fl, K)
            snap_b["cpu"] = proc_cpu()
            stop_i.set()
            await ti
            stop_s.set()
            await ts
            return irecs, samples, brecs, b_start, b_end, ph, err, snap_a, snap_b

    irecs, samples, brecs, b_start, b_end, ph, err, snap_a, snap_b = asyncio.run(main())
    alive = px.proc.poll() is None
    procs.stop_all()
    slots = sum(p["slots"] for p in fl)
    res.update({"proxy_alive_at_end": alive, "error": err,
                "interactive_rate_rps": cap * K * a.load / 100.0,
                "window_wall_s": [b_start, b_end],
                "interactive": interactive_stats(irecs, b_start, b_end, K),
                "busy": busy_between(snap_a, snap_b, fl),
                "samples": samples, "slots": slots,
                "cpu_share": {k: (snap_b["cpu"][k] - snap_a["cpu"][k]) / (snap_b["t"] - snap_a["t"])
                              for k in snap_a["cpu"]}})
    ins = [s for s in samples if b_start <= s[0] <= b_end]
    res["busy_samples_mean"] = (sum(s[1] for s in ins) / (len(ins) * slots)) if ins else None
    if run.startswith("base-"):
        return res
    res["makespan_wall_s"] = b_end - b_start
    res["makespan_phone_s"] = (b_end - b_start) * K
    if ph is not None:
        res["phases"] = {k: v for k, v in ph.items() if k not in ("batch",)}
        res["batch_object"] = ph.get("batch")
    if brecs is not None:
        got = [r for r in brecs if r is not None]
        ok = [r for r in got if r.get("ok")]
        kinds = {}
        for r in got:
            if not r.get("ok"):
                kinds[r.get("kind") or "?"] = kinds.get(r.get("kind") or "?", 0) + 1
        if len(got) < len(bodies):
            kinds["missing"] = len(bodies) - len(got)
        tim = [r["timings"] for r in ok if r.get("timings")]
        cn, pn = sum(x[0] for x in tim), sum(x[1] for x in tim)
        by_g = {}
        for r in ok:
            if r.get("timings"):
                e = by_g.setdefault(grp[r["i"]], [0, 0])
                e[0] += r["timings"][0]
                e[1] += r["timings"][0] + r["timings"][1]
        res.update({"lines": len(bodies), "ok": len(ok), "failed": len(bodies) - len(ok),
                    "fail_kinds": kinds, "cache_n": cn, "prompt_n": pn,
                    "cache_hit": cn / (cn + pn) if cn + pn else None,
                    "cache_hit_by_group": {g: v[0] / v[1] for g, v in sorted(by_g.items()) if v[1]},
                    "lines_per_replica": _count(r.get("replica") for r in ok),
                    # lines that found less than half their group's prefix cached
                    "lines_cold": sum(1 for r in ok if r.get("timings")
                                      and r["timings"][0] < ideal[r["i"]] / 2)})
        done = sorted(r["t_done"] for r in got if r.get("t_done") is not None)
        if done:
            res["done_times_wall_s"] = [round(x, 3) for x in done]
        # the client script's lines: each one's latency, sent to answered (phone s)
        lat = [(r["t_done"] - r["t_send"]) * K for r in ok if r.get("t_send") is not None]
        if lat:
            res["line_p50"], res["line_p99"] = bl.pct(lat, 50), bl.pct(lat, 99)
        if res["makespan_phone_s"] > 0:
            res["lines_per_phone_s"] = len(ok) / res["makespan_phone_s"]
    if pname == "fleetgate":
        g = gateway_batch_log(px.log, t0_epoch[0])
        if g:
            res["idle_while_queued"] = idle_while_queued(samples, g.pop("queued_spans"), slots,
                                                         b_start, b_end)
        res["gateway_log"] = g
    # Busy before the tail: samples while more lines were left than the fleet has slots.
    if res.get("phases") or res.get("done_times_wall_s"):
        t_tail = _tail_start(res, len(bodies), slots)
        if t_tail:
            tin = [s for s in samples if b_start <= s[0] <= t_tail]
            res["t_tail_wall_s"] = t_tail
            res["busy_samples_before_tail"] = (sum(s[1] for s in tin) / (len(tin) * slots)) if tin else None
    return res


def _per_class(per_replica, phones):
    cls = {p["id"]: fleet.SHORT[p["class"]] for p in phones}
    out = {}
    for rid, n in per_replica.items():
        k = cls.get(rid, str(rid))
        out[k] = out.get(k, 0) + n
    return out


def _count(it):
    out = {}
    for x in it:
        out[x] = out.get(x, 0) + 1
    return out


def _tail_start(res, n, slots):
    """Wall time from which fewer lines were left than the fleet has slots."""
    if res.get("done_times_wall_s"):
        d = res["done_times_wall_s"]
        k = n - slots
        return d[k] if 0 <= k < len(d) else None
    for t, st, rc in res["phases"].get("statuses", []):
        if rc and (rc.get("completed", 0) + rc.get("failed", 0)) >= n - slots:
            return t
    return None


# ------------------------------------------------------------------------------ main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default=",".join(r for r in RUNS if r != "direct"),
                    help="of: " + ",".join(RUNS) + " (direct only when named)")
    ap.add_argument("--lines", type=int, default=2000)
    ap.add_argument("--groups", type=int, default=3, help="distinct system prompts")
    ap.add_argument("--system-tokens", type=int, default=3000, help="shared system prompt size")
    ap.add_argument("--user-tokens", type=int, default=200, help="each line's own part")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=0,
                    help="the client script's requests in flight (default: the fleet's slots)")
    ap.add_argument("--load", type=float, default=50.0, help="interactive load, %% of capacity")
    ap.add_argument("--scale", type=float, default=10.0, help="sim time scale K")
    ap.add_argument("--lead", type=float, default=3.0, help="wall s from fleet start to traffic")
    ap.add_argument("--warm", type=float, default=3.0,
                    help="wall s of interactive traffic alone before the batch starts")
    ap.add_argument("--base-window", type=float, default=40.0,
                    help="wall s of interactive traffic measured in the baselines")
    ap.add_argument("--max-batch-wall", type=float, default=400.0)
    ap.add_argument("--poll", type=float, default=0.25, help="wall s between batch polls")
    ap.add_argument("--sample-every", type=float, default=1.0, help="wall s between /metrics samples")
    ap.add_argument("--client-timeout-sim", type=float, default=600.0)
    ap.add_argument("--phones", type=int, default=0, help="fewer phones (default: the 24 of fleet.py)")
    ap.add_argument("--fleetgate-config", default="",
                    help="JSON merged into every fleetgate run's configuration")
    ap.add_argument("--tenants", choices=("none", "apart", "shared"), default="none",
                    help="fleetgate runs with two API keys: the batch's and the interactive "
                         "traffic's, each its own cache scope (apart) or one (shared); none: "
                         "an open gateway")
    ap.add_argument("--agents", action="store_true",
                    help="fleetgate checks the phones as agents (/agent/v1/status), as phones "
                         "registered by heartbeat are: their agents keep API keys' cache "
                         "scopes apart themselves")
    ap.add_argument("--cache-mode", choices=("full", "hybrid"), default="full",
                    help="the sims' prompt cache: any common prefix (a transformer, B5's old "
                         "mode) or b10587's checkpoints of a hybrid model (Qwen3.5)")
    ap.add_argument("--shared-in", choices=("system", "user", "none"), default="system",
                    help="the shared instructions as a system message, or opening the user "
                         "message; none: every line its own instructions (nothing to reuse)")
    ap.add_argument("--verify", choices=("fresh", "trusted", "off"), default="fresh",
                    help="fleetgate's answer checks: fresh (default: a new gateway, every phone a "
                         "newcomer checked early and held while a check is undecided), trusted "
                         "(every phone with the record of a fleet in service in data_dir, as B2's "
                         "and B7's), off")
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.lines, a.base_window = 500, 20.0
    if a.smoke:
        a.lines, a.phones, a.system_tokens, a.user_tokens = 60, 6, 1500, 100
        a.base_window, a.warm, a.lead, a.max_batch_wall = 4.0, 1.5, 1.5, 60.0
    runs = [r for r in a.runs.split(",") if r]
    bad = [r for r in runs if r not in RUNS]
    if bad:
        sys.exit(f"b5: unknown runs {bad}")
    if not bl.have("nginx"):
        print("# nginx not installed: its runs skipped")
        runs = [r for r in runs if PROXY_OF[r] != "nginx"]
    phones = fleet.build(a.phones or None)
    if a.agents:
        for p in phones:
            p["agent"] = True
    if a.cache_mode == "hybrid":
        for p in phones:
            p["sim_args"] = ["--cache-mode", "hybrid"]
    slots = sum(p["slots"] for p in phones)
    a.concurrency = a.concurrency or slots
    K = a.scale
    wd = bl.workdir("b5")
    if "batch" in runs:
        ok, why = batch_api_supported(wd)
        if not ok:
            sys.exit(f"b5: {bl.gateway_bin()} has no Batch API (its config check says: {why})")
    bodies, grp = make_lines(a.lines, a.groups, a.system_tokens, a.user_tokens, a.max_tokens, a.seed,
                             a.shared_in)
    ideal, ntok = ideal_cache(bodies, grp)
    ic, it = sum(ideal), sum(ntok)
    cap = fleet.capacity(phones)
    print(f"# fleet: {len(phones)} phones, {slots} slots; interactive {a.load:g} % of "
          f"{cap * K:.1f} req/s; batch {a.lines} lines x ~{it // max(1, a.lines)} tokens "
          f"({a.groups} system prompts of ~{a.system_tokens}), script concurrency "
          f"{a.concurrency}; ideal cache hit {ic / it * 100:.1f} %; sims' cache {a.cache_mode}, "
          f"shared part in the {a.shared_in} message", flush=True)
    results = []
    t_start = time.monotonic()
    for run in runs:
        t_r = time.monotonic()
        r = run_one(run, a, phones, bodies, grp, ideal, wd)
        r["run_wall_s"] = time.monotonic() - t_r
        results.append(r)
        i = r["interactive"]
        msg = (f"# {run:14} interactive n {i['n']} failed {i['failed']} p99 {bl.fmt(i['p99'], 1)} s; "
               f"busy {bl.fmt((r['busy']['all'] or 0) * 100, 1)} %")
        if not run.startswith("base-"):
            msg += (f"; batch ok {r.get('ok')}/{a.lines} {r.get('fail_kinds') or ''} makespan "
                    f"{bl.fmt(r.get('makespan_phone_s'), 0)} phone-s, cache hit "
                    f"{bl.fmt((r.get('cache_hit') or 0) * 100, 1)} %")
        if r.get("error"):
            msg += f"; ERROR {r['error']}"
        print(msg + f" ({r['run_wall_s']:.0f} s)", flush=True)
        print("#   CPU (cores) during it: " + ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_share"].items()),
              flush=True)
        if r.get("lines_per_replica"):
            print(f"#   lines per phone class {_per_class(r['lines_per_replica'], phones)}, lines "
                  f"that missed their system prompt {r.get('lines_cold')}", flush=True)
        iq = r.get("idle_while_queued")
        if iq and iq["share"] is not None and r.get("makespan_phone_s"):
            print(f"#   batch lines waited in the gateway's queue while slots were idle in "
                  f"{iq['share'] * 100:.0f} % of the samples (then {iq['idle_slots_mean']:.1f} slots "
                  f"idle, {iq['waiting_mean']:.1f} lines waiting)", flush=True)
        ph = r.get("phases")
        if ph:
            st = r["window_wall_s"][0]
            f = lambda k: bl.fmt((ph[k] - st) * K, 1) if ph.get(k) is not None else "n/a"
            print(f"#   Batch API, phone-s from the upload's start: uploaded {f('t_uploaded')}, "
                  f"created {f('t_created')}, in_progress seen {f('t_in_progress')}, ended "
                  f"{f('t_terminal')}, output read {bl.fmt(r['makespan_phone_s'], 1)}", flush=True)
    wall = time.monotonic() - t_start

    by = {r["run"]: r for r in results}
    base_of = {"nginx": "base-nginx", "plain": "base-fleetgate", "batch": "base-fleetgate",
               "direct": "base-fleetgate", "base-nginx": "base-nginx",
               "base-fleetgate": "base-fleetgate"}
    ref = by.get("nginx")
    for r in results:
        b = by.get(base_of[r["run"]])
        r["p99_vs_baseline"] = (r["interactive"]["p99"] / b["interactive"]["p99"]
                                if b and b is not r and r["interactive"]["p99"] and b["interactive"]["p99"] else None)
        r["fraud_p99_vs_baseline"] = _ratio(r, b, "fraud")
        r["makespan_vs_nginx"] = (r["makespan_phone_s"] / ref["makespan_phone_s"]
                                  if ref and r.get("makespan_phone_s") and r is not ref else None)
        for k in ("line_p50", "line_p99", "lines_per_phone_s"):
            r[k + "_vs_nginx"] = (r[k] / ref[k] if ref and r is not ref and r.get(k)
                                  and ref.get(k) else None)

    headers = ["run", "proxy", "batch ok/failed", "makespan phone-s", "× nginx script",
               "phones busy % (flag/mid/budget)", "busy % before tail", "cache hit % (ideal)",
               "interactive n", "interactive p99 s", "× baseline", "fraud/scam/chat p99 s",
               "fraud p99 × baseline", "chat TTFT p99 s"]
    rows = []
    for r in results:
        i, bz = r["interactive"], r["busy"]
        c = i["classes"]
        batch = not r["run"].startswith("base-")
        rows.append([
            r["run"], r["proxy"],
            f"{r.get('ok')}/{r.get('failed')}" if batch and r.get("ok") is not None else ("-" if not batch else "error"),
            bl.fmt(r.get("makespan_phone_s"), 0) if batch else "-",
            bl.fmt(r.get("makespan_vs_nginx"), 2) if batch and r["run"] != "nginx" else "-",
            f"{bl.fmt((bz['all'] or 0) * 100, 1)} ({'/'.join(bl.fmt(bz['by_class'].get(k, 0) * 100, 0) for k in ('flag', 'mid', 'budget'))})",
            bl.fmt((r.get("busy_samples_before_tail") or 0) * 100, 1) if r.get("busy_samples_before_tail") is not None else "-",
            f"{bl.fmt((r.get('cache_hit') or 0) * 100, 1)} ({ic / it * 100:.1f})" if r.get("cache_hit") is not None else "-",
            i["n"], bl.fmt(i["p99"], 1), bl.fmt(r["p99_vs_baseline"], 2) if batch else "-",
            "/".join(bl.fmt(c[k]["p99"], 1) for k in ("fraud", "scam", "chat")),
            bl.fmt(r["fraud_p99_vs_baseline"], 2) if batch else "-",
            bl.fmt(c["chat"].get("ttft_p99"), 1)])
    print()
    print(bl.table(headers, rows))

    verdict = []
    bt = by.get("batch")
    if bt and bt.get("p99_vs_baseline") is not None:
        v = bt["p99_vs_baseline"]
        verdict.append(f"interactive p99 with the Batch API running / without: {v:.2f}x "
                       f"({'met' if v <= 1.1 else 'MISSED'} <= 1.1x; fraud reviews "
                       f"{bl.fmt(bt['fraud_p99_vs_baseline'], 2)}x)")
    if bt and bt.get("makespan_vs_nginx") is not None:
        v = bt["makespan_vs_nginx"]
        verdict.append(f"Batch API makespan / nginx script's: {v:.2f}x ({'met' if v <= 0.7 else 'MISSED'} <= 0.7x)")
    if bt and bt["busy"]["all"] is not None and bt.get("makespan_phone_s"):
        v = bt["busy"]["all"]
        verdict.append(f"phones busy during the Batch API's makespan: {v * 100:.1f} % "
                       f"({'met' if v >= 0.9 else 'MISSED'} >= 90 %)")
    for r in results:
        if r.get("failed") or r.get("error") or r["interactive"]["failed"] or not r["proxy_alive_at_end"]:
            verdict.append(f"{r['run']}: batch failed {r.get('failed')} {r.get('fail_kinds') or ''}, "
                           f"interactive failed {r['interactive']['failed']} "
                           f"{r['interactive']['fail_kinds'] or ''}, error {r.get('error')}, "
                           f"proxy alive {r['proxy_alive_at_end']}")
    for r in results:
        if r.get("line_p50_vs_nginx") is None and r.get("lines_per_phone_s_vs_nginx") is None:
            continue
        print(f"# {r['run']} beside the nginx script (weighted round-robin): line latency p50 "
              f"{bl.fmt(r.get('line_p50'), 1)} s ({bl.fmt(r.get('line_p50_vs_nginx'), 2)}x), p99 "
              f"{bl.fmt(r.get('line_p99'), 1)} s ({bl.fmt(r.get('line_p99_vs_nginx'), 2)}x), "
              f"throughput {bl.fmt(r.get('lines_per_phone_s'), 2)} lines/phone-s "
              f"({bl.fmt(r.get('lines_per_phone_s_vs_nginx'), 2)}x)")
    for v in verdict:
        print("# target " + v)
    name = "b5_batch_smoke" if a.smoke else ("b5_batch_quick" if a.quick else "b5_batch")
    if a.cache_mode != "full" or a.shared_in != "system":  # beside the old mode's results
        name += f"_{a.cache_mode}_{a.shared_in}"
    bl.save_results("b5_batch", name, {
        "params": {k: v for k, v in vars(a).items()}, "runs": runs, "fleet": phones,
        "timeouts_wall_s": peers.default_timeouts(K), "interactive_capacity_rps": cap * K,
        "ideal_cache_hit": ic / it, "batch_tokens_total": it, "wall_s": wall,
        "results": results, "verdict": verdict}, headers, rows)
    print(f"# wall time {wall:.0f} s")
    if a.smoke:
        bad = [r["run"] for r in results if r.get("error") or not r["proxy_alive_at_end"]
               or (not r["run"].startswith("base-") and r.get("ok") != a.lines)
               or (r["interactive"]["ok"] == 0 and a.load > 0)]
        if bad:
            sys.exit(f"b5 smoke failed: {bad}")
        print("b5 smoke ok")


def _ratio(r, b, cls):
    if not b or b is r:
        return None
    x, y = r["interactive"]["classes"][cls]["p99"], b["interactive"]["classes"][cls]["p99"]
    return x / y if x and y else None


if __name__ == "__main__":
    main()
