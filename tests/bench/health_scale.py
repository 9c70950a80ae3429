#!/usr/bin/env python3
"""Health checks at fleet scale (issue 34, "Health and lookups at scale"): many scripted
phones in one process (tests/bench/phones.c, built as fleetgate-bench-phones), each on a
port of its own (so each is a connection of its own to the gateway, as real phones are),
answering /health, /agent/v1/status and chat completions, and counting what they are
asked. It measures, for the gateway binary given:

  idle   the gateway's CPU (utime + stime over a window) and resident memory with N idle
         phones probed every health.interval_s, and the probes the phones saw;
  busy   probes per second per busy phone: K phones each hold one request, half of them a
         streamed answer (a chunk every --token-ms) and half a whole answer (nothing until
         it ends); idle phones beside them for comparison.

  /usr/bin/python3 tests/bench/health_scale.py --phones 12,1200,6000 --busy 200
  /usr/bin/python3 tests/bench/health_scale.py --gateway /path/to/old/fleetgate --label before

Memory per phone is the difference of the gateway's resident memory between two fleet
sizes over the difference of phones. Results go to results/health_scale-LABEL.json.
Everything listens on 127.0.0.1; every process is the script's own and is stopped by it."""

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.request
from pathlib import Path

import benchlib as bl

# ---------------------------------------------------------------------------- the driver


def get_json(url, timeout=10, data=None):
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def phones_bin():
    return os.environ.get("FLEETGATE_BENCH_PHONES") or str(bl.ROOT / "build/tests/bench/fleetgate-bench-phones")


def start_phones(procs, wd, n, agent, token_ms):
    pf = wd / f"phones-{n}.json"
    pf.unlink(missing_ok=True)  # an earlier run's fleet of the same size left its ports here
    pf = str(pf)
    argv = [phones_bin(), "--phones", str(n), "--ports-file", pf,
            "--token-ms", str(token_ms)] + (["--agent"] if agent else [])
    p = procs.spawn(f"phones-{n}", argv, log=wd / f"phones-{n}.log")
    deadline = time.monotonic() + 120
    while not Path(pf).exists():
        if p.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the phones did not start: {(wd / f'phones-{n}.log').read_text()[-2000:]}")
        time.sleep(0.2)
    return p, json.loads(Path(pf).read_text())


def gateway_config(port, ports, agent, health):
    return {
        "listen": [{"address": f"127.0.0.1:{port}"}],
        "log_level": "info",  # its port, in "listening on" (start_gateway)
        "queue": {"max": 100000, "timeout_s": 600},
        "scheduler": {"default_max_tokens": 64, "expected_output_tokens": 64},
        "upstream": {"allow_http": True, "allow_addresses": ["127.0.0.0/8"], "timeout_min_s": 60},
        "health": dict({"interval_s": 5, "busy_interval_s": 1, "late_s": 1, "timeout_s": 3,
                        "readyz_counts": True}, **health),
        "replicas": [{"id": f"p{i}", "url": f"http://127.0.0.1:{pt}", "models": [f"m{i}"], "slots": 1,
                      "prefill_tps": 1000, "decode_tps": 20, "agent": agent}
                     for i, pt in enumerate(ports)],
    }


def start_gateway(procs, wd, binary, ports, agent, health):
    # the gateway picks its own port (127.0.0.1:0) and says which in its log: a port picked
    # free here may be taken by another program before the gateway binds it
    cfg = wd / f"gw-{len(ports)}.json"
    log = wd / f"gw-{len(ports)}.log"
    log.unlink(missing_ok=True)  # an earlier gateway's "listening on" line is not this one's port
    cfg.write_text(json.dumps(gateway_config(0, ports, agent, health)))
    p = procs.spawn(f"gw-{len(ports)}", [binary, "--config", str(cfg)], log=log)
    port = None
    deadline = time.monotonic() + 60
    while port is None and time.monotonic() < deadline and p.poll() is None:
        for line in log.read_text(errors="replace").splitlines():
            if '"listening on 127.0.0.1:0 (port ' in line:
                port = int(line.split("(port ")[1].split(")")[0])
        time.sleep(0.1)
    if port is None:
        raise SystemExit(f"the gateway did not start: {log.read_text()[-2000:]}")
    url = f"http://127.0.0.1:{port}"
    # every phone ready; after 120 s, 98 % will do (a gateway that probes every phone at
    # once may time some out at the start, and brings them back only after down_interval_s)
    start = time.monotonic()
    ready = 0
    while time.monotonic() - start < 300 and p.poll() is None:
        try:
            ready = get_json(url + "/readyz", timeout=5).get("replicas_ready", 0)
        except OSError:
            pass
        if ready >= len(ports) or (time.monotonic() - start > 120 and ready >= 0.98 * len(ports)):
            return p, url, ready, round(time.monotonic() - start, 1)
        time.sleep(0.5)
    raise SystemExit(f"{ready} of {len(ports)} phones ready after 300 s: {(wd / f'gw-{len(ports)}.log').read_text()[-2000:]}")


def probes_of(counts, agent):
    return counts.get("/agent/v1/status" if agent else "/health") or []


def idle_run(procs, wd, binary, n, agent, warm_s, window_s, interval_s, idle_probes_per_s=None):
    phones, info = start_phones(procs, wd, n, agent, 50)
    health = {"interval_s": interval_s}
    if idle_probes_per_s is not None:  # a gateway from before the setting refuses the key
        health["idle_probes_per_s"] = idle_probes_per_s
    gw, url, ready, ready_s = start_gateway(procs, wd, binary, info["ports"], agent, health)
    ctl = f"http://127.0.0.1:{info['control']}"
    time.sleep(warm_s)
    get_json(ctl, data=b"")
    c0, t0 = bl.cpu_ticks(gw.pid), time.monotonic()
    time.sleep(window_s)
    c1, t1 = bl.cpu_ticks(gw.pid), time.monotonic()
    counts = get_json(ctl)
    rss = bl.rss_kb(gw.pid)
    probes = sum(probes_of(counts, agent))
    out = {"phones": n, "ready": ready, "ready_after_s": ready_s,
           "cpu_pct": round(100 * (c1 - c0) / (t1 - t0), 2),
           "probes_per_s": round(probes / (t1 - t0), 1),
           "cpu_us_per_probe": round(1e6 * (c1 - c0) / probes, 1) if probes else None,
           "rss_kb": rss}
    procs.stop(gw)
    procs.stop(phones)
    return out


def busy_run(procs, wd, binary, n, k, agent, seconds, token_ms):
    """k of n phones get one request each (even: a stream, odd: a whole answer) lasting
    about `seconds`; probes per second per phone while they run."""
    phones, info = start_phones(procs, wd, n, agent, token_ms)
    gw, url, _, _ = start_gateway(procs, wd, binary, info["ports"], agent, {})
    ctl = f"http://127.0.0.1:{info['control']}"
    time.sleep(3)
    n_tok = int(seconds * 1000 / token_ms)

    async def one(session, i):
        body = {"model": f"m{i}", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": n_tok, "stream": i % 2 == 0}
        async with session.post(url + "/v1/chat/completions", json=body) as r:
            await r.read()
            return r.status

    async def all_requests():
        import aiohttp
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=seconds * 4 + 60),
                                         connector=aiohttp.TCPConnector(limit=0)) as s:
            return await asyncio.gather(*(one(s, i) for i in range(k)))

    get_json(ctl, data=b"")
    c0, t0 = bl.cpu_ticks(gw.pid), time.monotonic()
    statuses = asyncio.run(all_requests())
    c1, t1 = bl.cpu_ticks(gw.pid), time.monotonic()
    counts = get_json(ctl)
    pr = probes_of(counts, agent)
    dur = t1 - t0
    stream = [pr[i] / dur for i in range(0, k, 2)]
    whole = [pr[i] / dur for i in range(1, k, 2)]
    idle = [pr[i] / dur for i in range(k, n)]
    avg = lambda v: round(sum(v) / len(v), 3) if v else None  # noqa: E731
    out = {"phones": n, "busy": k, "seconds": round(dur, 1), "ok": sum(1 for s in statuses if s == 200),
           "probes_per_s_streaming": avg(stream), "probes_per_s_whole": avg(whole),
           "probes_per_s_idle": avg(idle), "cpu_pct": round(100 * (c1 - c0) / dur, 2)}
    procs.stop(gw)
    procs.stop(phones)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gateway", default=bl.gateway_bin())
    ap.add_argument("--label", default="after")
    ap.add_argument("--phones", default="12,1200,6000", help="fleet sizes for the idle runs")
    ap.add_argument("--busy", type=int, default=200, help="busy phones in the busy run (0: none)")
    ap.add_argument("--busy-fleet", type=int, default=1200, help="phones in the busy run")
    ap.add_argument("--busy-s", type=float, default=20, help="how long each busy request runs")
    ap.add_argument("--token-ms", type=float, default=50)
    ap.add_argument("--agent", action="store_true", help="phones are agents (/agent/v1/status)")
    ap.add_argument("--interval-s", type=float, default=5, help="health.interval_s")
    ap.add_argument("--idle-probes-per-s", type=float, default=None,
                    help="health.idle_probes_per_s (default: the gateway's own; 0: every interval_s)")
    ap.add_argument("--warm-s", type=float, default=12)
    ap.add_argument("--window-s", type=float, default=30)
    ap.add_argument("--smoke", action="store_true", help="seconds, for CI (smoke.sh)")
    a = ap.parse_args()
    if a.smoke:
        a.phones, a.busy, a.busy_fleet, a.busy_s, a.warm_s, a.window_s = "12,40", 4, 12, 2, 2, 3
        a.label = "smoke"
    procs = bl.Procs()
    bl.install_signal_handlers(procs)
    wd = bl.workdir("health_scale")
    res = {"label": a.label, "gateway": a.gateway, "agent": a.agent, "interval_s": a.interval_s,
           "idle_probes_per_s": a.idle_probes_per_s,
           "machine": bl.machine(),
           "idle": [], "busy": None}
    for n in [int(x) for x in a.phones.split(",") if x]:
        r = idle_run(procs, wd, a.gateway, n, a.agent, a.warm_s, a.window_s, a.interval_s, a.idle_probes_per_s)
        print(json.dumps(r), flush=True)
        res["idle"].append(r)
    idle = sorted(res["idle"], key=lambda r: r["phones"])
    if len(idle) >= 2:
        lo, hi = idle[0], idle[-1]
        res["rss_kb_per_phone"] = round((hi["rss_kb"] - lo["rss_kb"]) / (hi["phones"] - lo["phones"]), 2)
        print(json.dumps({"rss_kb_per_phone": res["rss_kb_per_phone"]}), flush=True)
    if a.busy:
        res["busy"] = busy_run(procs, wd, a.gateway, a.busy_fleet, a.busy, a.agent, a.busy_s, a.token_ms)
        print(json.dumps(res["busy"]), flush=True)
    bl.save_json(f"health_scale-{a.label}.json", res)
    procs.stop_all()
    if res["busy"] and res["busy"]["ok"] != a.busy:
        raise SystemExit(f"{a.busy - res['busy']['ok']} of {a.busy} busy requests failed")


if __name__ == "__main__":
    main()
