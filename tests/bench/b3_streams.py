#!/usr/bin/python3
"""B3 — streams held open through the gateway.

N concurrent streaming chat requests (default 1,000, 5,000 and 10,000) held open through
fleetgate to simulated phones that generate one token per second per stream: the
gateway's resident memory (idle, and while holding N), its CPU, memory per stream
((RSS holding N - RSS idle) / N), and every stream that failed (non-200, refused, ended
early). A fresh gateway and fleet for each N. Optionally the same through nginx/HAProxy.
"first byte" counts the streams the proxy had started answering when the hold began;
"held" the streams open and not failed at its end, including any a proxy kept waiting
(in its listen queue or its own queue) for want of descriptors.

The fleet: 10 sims with 1,024 slots each; the gateway caps a replica at 64 slots, so each
sim is listed 16 times under different ids (160 replicas x 64 slots = 10,240 slots).

    tests/bench/b3_streams.py                      # 1000,5000,10000 through fleetgate
    tests/bench/b3_streams.py --proxies fleetgate,nginx,haproxy
    tests/bench/b3_streams.py --smoke              # 200 streams
Results: tests/bench/results/b3_streams.{json,csv}, chart b3_streams.png."""

import argparse
import asyncio
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as bl  # noqa: E402
import peers  # noqa: E402

try:
    import aiohttp
except ImportError:  # pragma: no cover
    sys.exit("b3: needs aiohttp for /usr/bin/python3 (apt-get install -y python3-aiohttp)")

MODEL = "qwen3.5-0.8b"
SIMS, SIM_SLOTS, COPIES = 10, 1024, 16


async def hold(url, headers, n, ramp_per_s, hold_s, max_tokens, pid, samples):
    """Open n streams (ramp_per_s per second), wait until each has its first byte, hold
    hold_s seconds sampling the proxy, then close them all. Returns per-stream outcomes."""
    body = json.dumps({"model": MODEL, "stream": True, "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": "Tell me a long story about phones."}]}).encode()
    conn = aiohttp.TCPConnector(limit=0, force_close=True)
    state = {"first": 0}
    outcomes = [None] * n
    stop = asyncio.Event()

    async def one(i):
        try:
            async with session.post(url, data=body, headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=30)) as r:
                if r.status != 200:
                    outcomes[i] = f"http_{r.status}"
                    await r.read()
                    return
                got = False
                ended = False
                async for chunk in r.content.iter_any():
                    if not got:
                        got = True
                        state["first"] += 1
                    if b"[DONE]" in chunk or b'"error"' in chunk:
                        ended = True
                    if stop.is_set():
                        break
                if stop.is_set():
                    outcomes[i] = "ok"
                else:
                    outcomes[i] = "ended_early" if not ended else "completed_before_hold_end"
        except asyncio.CancelledError:
            outcomes[i] = outcomes[i] or "ok"
            raise
        except aiohttp.ClientConnectorError:
            outcomes[i] = "connect_error"
        except (aiohttp.ClientError, OSError) as e:
            outcomes[i] = "error:" + type(e).__name__

    async with aiohttp.ClientSession(connector=conn) as session:
        tasks = []
        t0 = time.monotonic()
        for i in range(n):
            d = t0 + i / ramp_per_s - time.monotonic()
            if d > 0:
                await asyncio.sleep(d)
            tasks.append(asyncio.create_task(one(i)))
        ramp_s = time.monotonic() - t0
        # Wait (bounded) for every stream's first byte.
        deadline = time.monotonic() + 60
        while state["first"] + sum(1 for o in outcomes if o not in (None,)) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
        t_all = time.monotonic() - t0
        open_now = state["first"]
        c0 = sum(bl.cpu_ticks(p) or 0 for p in bl.tree_pids(pid))
        th = time.monotonic()
        while time.monotonic() - th < hold_s:
            samples.append(bl.tree_rss_kb(pid))
            await asyncio.sleep(0.5)
        c1 = sum(bl.cpu_ticks(p) or 0 for p in bl.tree_pids(pid))
        held_at_end = sum(1 for o in outcomes if o is None)
        stop.set()
        for tk in tasks:
            tk.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"outcomes": outcomes, "ramp_s": ramp_s, "all_open_s": t_all, "opened": open_now,
            "held_at_end": held_at_end, "cpu_pct": (c1 - c0) / (time.monotonic() - th) * 100}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="1000,5000,10000")
    ap.add_argument("--proxies", default="fleetgate")
    ap.add_argument("--hold", type=float, default=10.0, help="seconds to hold all streams")
    ap.add_argument("--ramp", type=float, default=1000.0, help="new streams per second")
    ap.add_argument("--decode-tps", type=float, default=1.0, help="tokens per second per stream")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--no-chart", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.levels, a.hold, a.no_chart = "200", 2.0, True
    levels = [int(x) for x in a.levels.split(",") if x]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(f"# open-files limit {hard} per process (each proxied stream needs 2 in the proxy)")
    names = peers.available([n for n in a.proxies.split(",") if n])
    results = []
    for n in levels:
        for name in names:
            procs = bl.Procs()
            bl.install_signal_handlers(procs)
            wd = bl.workdir("b3")
            sims = []
            for i in range(SIMS):
                port = bl.free_port()
                p = procs.spawn(f"sim{i}", [bl.agent_bin(), "--engine", "sim", "--listen", f"{bl.HOST}:{port}",
                                            "--model", MODEL, "--slots", str(SIM_SLOTS), "--prefill-tps", "10000",
                                            "--decode-tps", str(a.decode_tps), "--n-ctx", "65536",
                                            "--id", f"bulk-{i}", "--log-level", "warn"], log=wd / f"sim{i}.log")
                sims.append((port, p))
            for port, p in sims:
                if not bl.wait_port(port, proc=p):
                    sys.exit("b3: a sim did not start")
            if name == "fleetgate":
                reps = [{"id": f"s{i}-{c}", "port": port, "slots": 64, "prefill_tps": 10000,
                         "decode_tps": a.decode_tps, "n_ctx": 65536}
                        for i, (port, _) in enumerate(sims) for c in range(COPIES)]
            else:
                reps = [{"id": f"s{i}", "port": port, "slots": SIM_SLOTS} for i, (port, _) in enumerate(sims)]
            t = peers.default_timeouts(1.0)
            t["stream_idle"] = 120
            px = peers.start(name, procs, wd, reps, t, MODEL, access_log=True)
            time.sleep(1.0)
            idle = bl.tree_rss_kb(px.proc.pid)
            samples = []
            max_tokens = int((n / a.ramp + 60 + a.hold + 30) * a.decode_tps) + 10
            r = asyncio.run(hold(px.url() + "/v1/chat/completions",
                                 {"Content-Type": "application/json", **px.headers}, n, a.ramp, a.hold,
                                 max_tokens, px.proc.pid, samples))
            alive = px.proc.poll() is None
            time.sleep(1.0)
            after = bl.tree_rss_kb(px.proc.pid) if alive else None
            procs.stop_all()
            kinds = {}
            for o in r["outcomes"]:
                o = o or "unknown"
                if o != "ok":
                    kinds[o] = kinds.get(o, 0) + 1
            peak = max([x for x in samples if x] or [0])
            med = bl.median([x for x in samples if x])
            res = {"proxy": name, "streams": n, "opened": r["opened"], "held_at_end": r["held_at_end"],
                   "errors": sum(kinds.values()), "error_kinds": kinds, "rss_idle_kb": idle,
                   "rss_hold_kb": med, "rss_peak_kb": peak, "rss_after_close_kb": after,
                   "kb_per_stream": ((med - idle) / n) if med and idle else None,
                   "cpu_pct_holding": r["cpu_pct"], "ramp_s": r["ramp_s"], "all_open_s": r["all_open_s"],
                   "alive": alive, "tokens_per_s_total": n * a.decode_tps}
            results.append(res)
            log_tail = ""
            if px.log and Path(px.log).exists():
                lines = [ln for ln in Path(px.log).read_text(errors="replace").splitlines()
                         if '"level":"error"' in ln or '"level":"warn"' in ln or "emerg" in ln or "alert" in ln.lower()]
                log_tail = "\n".join(lines[-5:])
                res["proxy_log_warnings"] = len(lines)
                res["proxy_log_last"] = lines[-5:]
            print(f"# {name:9} {n:6d} streams: opened {r['opened']} held {r['held_at_end']} errors "
                  f"{res['errors']} {kinds or ''} RSS idle {idle / 1024:.1f} MB hold {(med or 0) / 1024:.1f} MB "
                  f"-> {bl.fmt(res['kb_per_stream'], 1)} KB/stream, CPU {r['cpu_pct']:.0f}%", flush=True)
            if log_tail:
                print("#   last warnings:", log_tail[:600].replace("\n", "\n#   "))
    headers = ["proxy", "streams", "first byte", "held", "errors", "RSS idle MB", "RSS holding MB", "KB per stream",
               "CPU % holding", "errors by kind"]
    rows = [[r["proxy"], r["streams"], r["opened"], r["held_at_end"], r["errors"], bl.fmt(r["rss_idle_kb"] / 1024, 1),
             bl.fmt((r["rss_hold_kb"] or 0) / 1024, 1), bl.fmt(r["kb_per_stream"], 1),
             bl.fmt(r["cpu_pct_holding"], 0), " ".join(f"{k}:{v}" for k, v in r["error_kinds"].items()) or "-"]
            for r in results]
    print()
    print(bl.table(headers, rows))
    for r in results:
        if r["proxy"] == "fleetgate":
            ok = r["kb_per_stream"] is not None and r["kb_per_stream"] < 20 and (r["streams"] < 10000 or r["errors"] == 0)
            print(f"# target fleetgate {r['streams']} streams: {bl.fmt(r['kb_per_stream'], 1)} KB/stream, "
                  f"{r['errors']} errors ({'met' if ok else 'MISSED'})")
    name = "b3_streams_smoke" if a.smoke else "b3_streams"
    out = bl.save_results("b3_streams", name, {
        "params": {"levels": levels, "hold_s": a.hold, "ramp_per_s": a.ramp, "decode_tps": a.decode_tps,
                   "nofile_limit": hard},
        "results": results}, headers, rows)
    if not a.no_chart:
        import charts
        print("# chart:", charts.b3(out))
    if a.smoke:
        r = results[0]
        if r["errors"] or not r["alive"]:
            sys.exit(f"b3 smoke failed: {r}")
        print("b3 smoke ok")


if __name__ == "__main__":
    main()
