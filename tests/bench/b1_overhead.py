#!/usr/bin/python3
"""B1 — overhead of each proxy in front of a fast upstream.

A fast upstream (nginx answering every POST with one fixed chat completion) and `wrk`
POSTing a realistic chat request over keep-alive connections: requests per second at
saturation and wrk's p50/p99 there; then `hey` at a fixed, moderate rate for the latency a
proxy adds when it is not saturated. Direct to the upstream (the limit) vs nginx, HAProxy,
Portkey and fleetgate, over HTTP and HTTPS (each proxy terminates TLS; the upstream hop is
plain HTTP, as on one host). Targets are run in rotating order, repeated for several
rounds; the report gives medians, min–max ranges and ratios.

    tests/bench/b1_overhead.py                 # 3 rounds, 8 s per measurement (~10 min)
    tests/bench/b1_overhead.py --quick         # 1 round, 3 s
    tests/bench/b1_overhead.py --smoke         # fleetgate + direct, HTTP, 1 s: does it work
Results: tests/bench/results/b1_overhead.{json,csv}, chart b1_overhead.png."""

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as bl  # noqa: E402
import peers  # noqa: E402

MODEL = "qwen3.5-0.8b"

SYSTEM = ("You are a fraud analyst for a payments company. Read the message below and "
          "decide whether it is a scam aimed at our customer. Consider impersonation of the "
          "bank or a government agency, urgency, requests for one-time codes, gift cards or "
          "crypto, links to look-alike domains and changes of payee details. Answer with one "
          "line: SCAM: yes or SCAM: no, then RISK_LEVEL from 1 to 5. ") * 2
USER = ("Hi, this is the security team of your bank. We noticed an unusual login to your "
        "account from a new device in another country. To keep your savings safe we have "
        "moved them to a protected account; please confirm the transfer by replying with "
        "the six-digit code we just sent you and install our secure app from the link "
        "below within 30 minutes, or the account will be frozen. Thank you for banking "
        "with us.")
REQUEST = {"model": MODEL, "messages": [{"role": "system", "content": SYSTEM},
                                        {"role": "user", "content": USER}],
           "max_tokens": 8, "temperature": 0}

ANSWER = {"choices": [{"finish_reason": "stop", "index": 0,
                       "message": {"role": "assistant", "content": "SCAM: yes RISK_LEVEL: 5"}}],
          "created": 1795981289, "model": MODEL, "system_fingerprint": "b1-upstream",
          "object": "chat.completion",
          "usage": {"completion_tokens": 8, "prompt_tokens": 412, "total_tokens": 420,
                    "prompt_tokens_details": {"cached_tokens": 0}},
          "id": "chatcmpl-4Uw4T7L0RickMSomtlEmjxYilYp8Mywo",
          "timings": {"cache_n": 0, "prompt_n": 412, "prompt_ms": 882.8, "prompt_per_token_ms": 2.14,
                      "prompt_per_second": 466.7, "predicted_n": 8, "predicted_ms": 200.0,
                      "predicted_per_token_ms": 25.0, "predicted_per_second": 40.0}}

UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def lat_ms(s):
    m = re.match(r"([\d.]+)(us|ms|s|m)$", s.strip())
    return float(m.group(1)) * UNITS[m.group(2)] if m else None


def run_wrk(url, script, conns, dur, cpu):
    argv = ["wrk", "-t1", f"-c{conns}", f"-d{dur}s", "--latency", "--timeout", "10s",
            "-s", str(script), url + "/v1/chat/completions"]
    if cpu is not None:
        argv = ["taskset", "-c", str(cpu)] + argv
    r = subprocess.run(argv, capture_output=True, text=True, timeout=dur + 60)
    out = r.stdout
    res = {"rps": None, "p50_ms": None, "p99_ms": None, "errors": 0, "non2xx": 0}
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if m:
        res["rps"] = float(m.group(1))
    for q, key in (("50%", "p50_ms"), ("99%", "p99_ms")):
        m = re.search(rf"^\s+{q}\s+(\S+)", out, re.M)
        if m:
            res[key] = lat_ms(m.group(1))
    m = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    if m:
        res["non2xx"] = int(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        res["errors"] = sum(int(x) for x in m.groups())
    m = re.search(r"(\d+) requests in", out)
    res["requests"] = int(m.group(1)) if m else 0
    if res["rps"] is None:
        res["raw"] = (out + r.stderr)[-800:]
    return res


def run_hey(url, body_file, headers, rate, conns, dur, cpu):
    argv = ["hey", "-z", f"{dur}s", "-c", str(conns), "-q", f"{rate / conns:.3f}", "-m", "POST",
            "-T", "application/json", "-D", str(body_file)]
    for k, v in headers.items():
        argv += ["-H", f"{k}: {v}"]
    argv.append(url + "/v1/chat/completions")
    if cpu is not None:
        argv = ["taskset", "-c", str(cpu)] + argv
    r = subprocess.run(argv, capture_output=True, text=True, timeout=dur + 60)
    out = r.stdout
    res = {"rps": None, "p50_ms": None, "p99_ms": None, "ok": 0, "failed": 0}
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if m:
        res["rps"] = float(m.group(1))
    for q, key in (("50", "p50_ms"), ("99", "p99_ms")):
        m = re.search(rf"^\s+{q}% in ([\d.]+) secs", out, re.M)
        if m:
            res[key] = float(m.group(1)) * 1000
    for code, n in re.findall(r"\[(\d+)\]\s+(\d+) responses", out):
        if code == "200":
            res["ok"] += int(n)
        else:
            res["failed"] += int(n)
    m = re.search(r"Error distribution:(.*)", out, re.S)
    if m:
        res["failed"] += sum(int(x) for x in re.findall(r"\[(\d+)\]", m.group(1)))
    if res["rps"] is None:
        res["raw"] = (out + r.stderr)[-800:]
    return res


def tree_cpu(pid):
    if not pid:
        return None
    v = [bl.cpu_ticks(p) for p in bl.tree_pids(pid)]
    v = [x for x in v if x is not None]
    return sum(v) if v else None


def lua_script(path, body_file, headers):
    lines = ['wrk.method = "POST"',
             f'local f = io.open("{body_file}", "rb"); wrk.body = f:read("*a"); f:close()',
             'wrk.headers["Content-Type"] = "application/json"']
    for k, v in headers.items():
        lines.append(f'wrk.headers["{k}"] = [==[{v}]==]')
    Path(path).write_text("\n".join(lines) + "\n")
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=8, help="seconds per wrk run (hey runs the same)")
    ap.add_argument("--conns", type=int, default=64, help="wrk keep-alive connections")
    ap.add_argument("--rate", type=float, default=1000, help="hey's fixed rate, requests/s")
    ap.add_argument("--proxies", default="direct,nginx,haproxy,portkey,fleetgate")
    ap.add_argument("--protocols", default="http,https")
    ap.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--no-chart", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.duration = 1, 3
    if a.smoke:
        a.rounds, a.duration, a.proxies, a.protocols, a.rate = 1, 1, "direct,fleetgate", "http", 200
        a.no_chart = True
    for tool in ("wrk", "hey", "nginx"):
        if not bl.have(tool):
            sys.exit(f"b1: {tool} is not installed (apt-get install -y nginx wrk hey)")
    dur = max(1, int(round(a.duration)))
    pin = not a.no_pin and bl.have("taskset") and (bl.os.cpu_count() or 1) >= 2
    # Proxy on CPU 0; upstream and load generator on CPU 1 (2-core machine).
    cpu_proxy, cpu_load = (0, 1) if pin else (None, None)

    procs = bl.Procs()
    bl.install_signal_handlers(procs)
    wd = bl.workdir("b1")
    cert, key = bl.make_cert(wd)
    body_file = wd / "request.json"
    body_file.write_text(json.dumps(REQUEST))
    up_port, up_tls = bl.free_port(), bl.free_port()
    upcfg = bl.render("nginx-upstream.conf", wd / "upstream.conf", dir=wd, port=up_port,
                      tls_port=up_tls, cert=cert, key=key,
                      body=json.dumps(ANSWER, separators=(",", ":")))
    up = procs.spawn("upstream", ["nginx", "-p", str(wd), "-e", str(wd / "upstream-error.log"),
                                  "-c", str(upcfg), "-g", "daemon off;"], log=wd / "upstream.out",
                     cpu=cpu_load)
    if not (bl.wait_port(up_port, proc=up) and bl.wait_port(up_tls, proc=up)):
        sys.exit("b1: upstream nginx did not start")
    replicas = [{"id": "upstream", "port": up_port, "slots": 64, "maxconn": 1024}]
    t = peers.default_timeouts(1.0)

    names = [n.strip() for n in a.proxies.split(",") if n.strip()]
    protos = [p.strip() for p in a.protocols.split(",") if p.strip()]
    targets = {}
    for n in names:
        if n == "direct":
            targets["direct"] = {"http": f"http://{bl.HOST}:{up_port}",
                                 "https": f"https://{bl.HOST}:{up_tls}", "headers": {}, "pid": None}
            continue
        if n not in peers.available([n]):
            continue
        px = peers.start(n, procs, wd, replicas, t, MODEL, cpu=cpu_proxy)
        targets[n] = {"http": px.url(False), "https": px.url(True), "headers": px.headers,
                      "pid": px.proc.pid, "config": str(px.config)}
    scripts = {n: lua_script(wd / f"{n}.lua", body_file, v["headers"]) for n, v in targets.items()}

    # Warm up each target (connections, TLS session caches, learned state) and check it answers.
    for n, v in targets.items():
        for proto in protos:
            if v[proto] is None:
                continue
            w = run_wrk(v[proto], scripts[n], 8, 1, cpu_load)
            if not w["rps"] or w["non2xx"] or w["errors"]:
                print(f"# warm-up {n} {proto}: {w}")

    runs = []
    order = list(targets)
    t0 = time.monotonic()
    for rnd in range(a.rounds):
        rot = order[rnd % len(order):] + order[:rnd % len(order)]
        for proto in protos:
            for n in rot:
                url = targets[n][proto]
                if url is None:
                    continue
                cpu0 = tree_cpu(targets[n]["pid"])
                w = run_wrk(url, scripts[n], a.conns, dur, cpu_load)
                cpu1 = tree_cpu(targets[n]["pid"])
                h = run_hey(url, body_file, targets[n]["headers"], a.rate, 16, dur, cpu_load)
                rss = bl.tree_rss_kb(targets[n]["pid"]) if targets[n]["pid"] else None
                rec = {"round": rnd, "proto": proto, "target": n, "wrk": w, "hey": h,
                       "proxy_cpu_s": (cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None,
                       "rss_kb": rss}
                runs.append(rec)
                print(f"# round {rnd + 1} {proto:5} {n:9} wrk {bl.fmt(w['rps'], 0)} req/s "
                      f"p50 {bl.fmt(w['p50_ms'], 2)} p99 {bl.fmt(w['p99_ms'], 2)} ms "
                      f"err {w['errors'] + w['non2xx']} | hey@{a.rate:.0f}/s p50 {bl.fmt(h['p50_ms'], 2)} "
                      f"p99 {bl.fmt(h['p99_ms'], 2)} ms failed {h['failed']}", flush=True)
    wall = time.monotonic() - t0

    # Medians, ranges, ratios.
    summary = []
    for proto in protos:
        direct = [r for r in runs if r["proto"] == proto and r["target"] == "direct"]
        d_p99 = bl.median([r["hey"]["p99_ms"] for r in direct])
        d_p50 = bl.median([r["hey"]["p50_ms"] for r in direct])
        for n in targets:
            rs = [r for r in runs if r["proto"] == proto and r["target"] == n]
            if not rs:
                continue
            rps = [r["wrk"]["rps"] for r in rs if r["wrk"]["rps"]]
            s = {"proto": proto, "target": n, "rounds": len(rs),
                 "rps_med": bl.median(rps), "rps_min": min(rps) if rps else None,
                 "rps_max": max(rps) if rps else None,
                 "wrk_p50_med": bl.median([r["wrk"]["p50_ms"] for r in rs]),
                 "wrk_p99_med": bl.median([r["wrk"]["p99_ms"] for r in rs]),
                 "hey_p50_med": bl.median([r["hey"]["p50_ms"] for r in rs]),
                 "hey_p99_med": bl.median([r["hey"]["p99_ms"] for r in rs]),
                 "hey_p99_min": min([r["hey"]["p99_ms"] for r in rs if r["hey"]["p99_ms"]] or [None]),
                 "hey_p99_max": max([r["hey"]["p99_ms"] for r in rs if r["hey"]["p99_ms"]] or [None]),
                 "errors": sum(r["wrk"]["errors"] + r["wrk"]["non2xx"] + r["hey"]["failed"] for r in rs),
                 "cpu_s_per_10k": bl.median([r["proxy_cpu_s"] / r["wrk"]["requests"] * 1e4
                                            for r in rs if r["proxy_cpu_s"] and r["wrk"]["requests"]]),
                 "rss_mb": bl.median([r["rss_kb"] / 1024 for r in rs if r["rss_kb"]])}
            s["added_p50_ms"] = (s["hey_p50_med"] - d_p50) if s["hey_p50_med"] is not None and d_p50 is not None else None
            s["added_p99_ms"] = (s["hey_p99_med"] - d_p99) if s["hey_p99_med"] is not None and d_p99 is not None else None
            summary.append(s)
    for proto in protos:
        ss = {s["target"]: s for s in summary if s["proto"] == proto}
        ng = ss.get("nginx")
        for s in ss.values():
            s["rps_vs_nginx"] = (s["rps_med"] / ng["rps_med"]) if ng and ng["rps_med"] and s["rps_med"] else None
            s["rps_vs_direct"] = (s["rps_med"] / ss["direct"]["rps_med"]) if "direct" in ss and s["rps_med"] else None

    headers = ["proto", "target", "req/s (median)", "range", "vs nginx", "wrk p50 ms", "wrk p99 ms",
               f"p50 ms @{a.rate:.0f}/s", f"p99 ms @{a.rate:.0f}/s", "added p99 ms", "CPU s/10k req",
               "RSS MB", "errors"]
    rows = [[s["proto"], s["target"], bl.fmt(s["rps_med"], 0),
             f"{bl.fmt(s['rps_min'], 0)}–{bl.fmt(s['rps_max'], 0)}", bl.fmt(s["rps_vs_nginx"], 2),
             bl.fmt(s["wrk_p50_med"], 2), bl.fmt(s["wrk_p99_med"], 2), bl.fmt(s["hey_p50_med"], 2),
             bl.fmt(s["hey_p99_med"], 2), bl.fmt(s["added_p99_ms"], 2), bl.fmt(s["cpu_s_per_10k"], 2),
             bl.fmt(s["rss_mb"], 1), s["errors"]] for s in summary]
    print()
    print(bl.table(headers, rows))
    verdict = []
    for proto in protos:
        ss = {s["target"]: s for s in summary if s["proto"] == proto}
        if "fleetgate" in ss and "nginx" in ss:
            f, n = ss["fleetgate"], ss["nginx"]
            ok_t = f["rps_med"] is not None and n["rps_med"] is not None and f["rps_med"] >= n["rps_med"]
            ok_l = (f["added_p99_ms"] is not None and n["added_p99_ms"] is not None
                    and f["added_p99_ms"] <= n["added_p99_ms"])
            verdict.append(f"{proto}: throughput fleetgate/nginx = {bl.fmt(f['rps_vs_nginx'], 2)} "
                           f"({'met' if ok_t else 'MISSED'}); added p99 fleetgate {bl.fmt(f['added_p99_ms'], 2)} ms "
                           f"vs nginx {bl.fmt(n['added_p99_ms'], 2)} ms ({'met' if ok_l else 'MISSED'})")
    for v in verdict:
        print("# target " + v)
    name = "b1_overhead_smoke" if a.smoke else "b1_overhead"
    out = bl.save_results("b1_overhead", name, {
           "params": {"rounds": a.rounds, "duration_s": dur, "wrk_conns": a.conns, "wrk_threads": 1,
                      "hey_rate": a.rate, "hey_conns": 16, "pinned": pin,
                      "request_bytes": len(json.dumps(REQUEST)),
                      "answer_bytes": len(json.dumps(ANSWER, separators=(",", ":")))},
           "wall_s": wall, "configs": {n: v.get("config") for n, v in targets.items()},
           "summary": summary, "runs": runs, "verdict": verdict}, headers, rows)
    procs.stop_all()
    if not a.no_chart:
        import charts
        print("# chart:", charts.b1(out))
    if a.smoke:
        bad = [s for s in summary if not s["rps_med"] or s["errors"]]
        if bad:
            sys.exit(f"b1 smoke failed: {bad}")
        print("b1 smoke ok")


if __name__ == "__main__":
    main()
