#!/usr/bin/python3
"""B4 — footprints: resident memory (VmRSS) of

  - the gateway idle, configured with B2's 24-phone fleet (after health probes settled);
  - the gateway under B2's load (steady, 95 % of capacity, fleetgate cell of b2_goodput);
  - the agent idle (--engine sim, and --engine openai in front of a sim when built);
  - the agent relaying 50 concurrent streams (--engine openai in front of a sim; the sim
    engine serving 50 streams itself is reported too), built from Debian's packages and,
    when deploy/build-agent-phone.sh has built it, as phones get it (slim static libcurl).
Peers' idle/under-load memory comes along for comparison (same B2 cell per proxy).

    tests/bench/b4_footprint.py            # ~1.5 min
    tests/bench/b4_footprint.py --smoke
Results: tests/bench/results/b4_footprint.{json,csv}, chart b4_footprint.png.
(tests/bench/agent_rss.* measures the agent in more detail: see "Agent memory".)"""

import argparse
import asyncio
import json
import subprocess
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
    sys.exit("b4: needs aiohttp for /usr/bin/python3")


def agent_has_openai(binary):
    try:
        r = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=10)
        return "openai" in (r.stdout + r.stderr)
    except Exception:
        return False


async def streams(url, n, hold_s, pid, samples):
    body = json.dumps({"model": fleet.MODEL, "stream": True, "max_tokens": 400,
                       "messages": [{"role": "user", "content": "Tell me about phones."}]}).encode()
    outcomes = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        async def one():
            try:
                async with s.post(url, data=body, headers={"Content-Type": "application/json"},
                                  timeout=aiohttp.ClientTimeout(total=hold_s + 30)) as r:
                    outcomes.append(r.status)
                    async for _ in r.content.iter_any():
                        pass
            except asyncio.CancelledError:
                raise
            except Exception as e:
                outcomes.append(type(e).__name__)
        tasks = [asyncio.create_task(one()) for _ in range(n)]
        await asyncio.sleep(1.0)
        t0 = time.monotonic()
        while time.monotonic() - t0 < hold_s:
            samples.append(bl.rss_kb(pid))
            await asyncio.sleep(0.25)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return outcomes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--proxies", default="nginx,haproxy,portkey,fleetgate")
    ap.add_argument("--streams", type=int, default=50)
    ap.add_argument("--phone-agent", help="the agent from deploy/build-agent-phone.sh "
                    "(default build-phone/agent/fleetgate-agent when it exists)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--no-chart", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.proxies, a.streams, a.no_chart = "fleetgate", 10, True
    rows = []
    procs = bl.Procs()
    bl.install_signal_handlers(procs)
    wd = bl.workdir("b4")
    K = 10.0
    phones = fleet.build()

    # Gateway (and peers) idle, configured with the B2 fleet, then under B2 steady 95 %.
    import b2_goodput as b2
    cap = fleet.capacity(phones)
    names = peers.available([n for n in a.proxies.split(",") if n])
    for name in names:
        (wd / f"idle-{name}").mkdir()
        fl = fleet.start_fleet(procs, wd / f"idle-{name}", phones, K)
        px = peers.start(name, procs, wd / f"idle-{name}", fl, peers.default_timeouts(K), fleet.MODEL, scale=K)
        time.sleep(5.0 if not a.smoke else 1.5)       # several health-probe rounds
        idle = bl.tree_rss_kb(px.proc.pid)
        procs.stop_all()
        rows.append({"what": f"{'gateway' if name == 'fleetgate' else name} idle, 24 replicas",
                     "proxy": name, "rss_mb": idle / 1024 if idle else None,
                     "target_mb": 20 if name == "fleetgate" else None})
        if a.smoke:
            continue
        ns = argparse.Namespace(scale=K, window=8.0, lead=3.0, client_timeout_sim=300.0, loads=[95])
        sched = fleet.schedule(cap * K * 0.95, ns.window, 20261129 + 95)
        import random
        rng = random.Random(20261129 * 7 + 95)
        bodies = [fleet.make_body(rng, wc) for _, wc in sched]
        res, _ = b2.run_cell(name, "steady", 95, ns, phones, cap, sched, bodies, wd)
        rows.append({"what": f"{'gateway' if name == 'fleetgate' else name} under B2 steady 95 %",
                     "proxy": name, "rss_mb": res["proxy_rss_max_kb"] / 1024,
                     "target_mb": None, "detail": f"{res['ok']}/{res['sent']} ok, CPU {res['proxy_cpu_s']:.1f} s"})

    # Agent: sim engine idle and serving N streams; openai engine relaying N streams.
    sim_port = bl.free_port()
    sim = procs.spawn("sim", [bl.agent_bin(), "--engine", "sim", "--listen", f"{bl.HOST}:{sim_port}",
                              "--model", fleet.MODEL, "--slots", str(a.streams), "--decode-tps", "10",
                              "--prefill-tps", "10000", "--n-ctx", "8192", "--log-level", "warn"],
                      log=wd / "agent-sim.log")
    bl.wait_port(sim_port, proc=sim)
    time.sleep(1.0)
    rows.append({"what": "agent (sim engine) idle", "proxy": "agent", "rss_mb": bl.rss_kb(sim.pid) / 1024,
                 "target_mb": None})
    samples = []
    out = asyncio.run(streams(f"http://{bl.HOST}:{sim_port}/v1/chat/completions", a.streams,
                              3.0 if not a.smoke else 1.0, sim.pid, samples))
    rows.append({"what": f"agent (sim engine) serving {a.streams} streams", "proxy": "agent",
                 "rss_mb": max(x for x in samples if x) / 1024, "target_mb": None,
                 "detail": f"statuses {sorted(set(map(str, out)))}"})
    # The relay as Debian's packages build it, and as deploy/build-agent-phone.sh builds it
    # for phones (slim static libcurl + OpenSSL), when that build exists.
    relays = [("agent (openai engine)", bl.agent_bin())]
    phone = a.phone_agent or str(bl.ROOT / "build-phone/agent/fleetgate-agent")
    if Path(phone).exists():
        relays.append(("phone-build agent (openai engine)", phone))
    for label, binary in relays:
        if not agent_has_openai(binary):
            continue
        ag_port = bl.free_port()
        log = wd / f"agent-openai-{len(rows)}.log"
        ag = procs.spawn("agent", [binary, "--engine", "openai", "--upstream", f"http://{bl.HOST}:{sim_port}",
                                   "--listen", f"{bl.HOST}:{ag_port}", "--model", fleet.MODEL,
                                   "--insecure-private-network", "--log-level", "warn"], log=log)
        if bl.wait_port(ag_port, proc=ag):
            time.sleep(1.0)
            rows.append({"what": f"{label} idle", "proxy": "agent",
                         "rss_mb": bl.rss_kb(ag.pid) / 1024, "target_mb": None})
            samples = []
            out = asyncio.run(streams(f"http://{bl.HOST}:{ag_port}/v1/chat/completions", a.streams,
                                      3.0 if not a.smoke else 1.0, ag.pid, samples))
            rows.append({"what": f"{label} relaying {a.streams} streams", "proxy": "agent",
                         "rss_mb": max(x for x in samples if x) / 1024, "target_mb": 8,
                         "detail": f"statuses {sorted(set(map(str, out)))}"})
        else:
            tail = log.read_text()[-400:]
            rows.append({"what": f"{label} relaying", "proxy": "agent", "rss_mb": None,
                         "target_mb": 8, "detail": "did not start: " + tail.replace("\n", " ")})
        procs.stop(ag)
    procs.stop_all()

    headers = ["what", "RSS MB", "target", "detail"]
    trows = [[r["what"], bl.fmt(r["rss_mb"], 1), f"< {r['target_mb']} MB" if r["target_mb"] else "-",
              r.get("detail", "")] for r in rows]
    print(bl.table(headers, trows))
    for r in rows:
        if r["target_mb"] and r["rss_mb"] is not None:
            print(f"# target {r['what']}: {r['rss_mb']:.1f} MB ({'met' if r['rss_mb'] < r['target_mb'] else 'MISSED'}"
                  f" < {r['target_mb']} MB)")
    name = "b4_footprint_smoke" if a.smoke else "b4_footprint"
    res = bl.save_results("b4_footprint", name, {"results": rows}, headers, trows)
    if not a.no_chart:
        import charts
        print("# chart:", charts.b4(res))
    if a.smoke:
        if not rows or rows[0]["rss_mb"] is None:
            sys.exit("b4 smoke failed")
        print("b4 smoke ok")


if __name__ == "__main__":
    main()
