#!/usr/bin/python3
"""Resident memory of fleetgate-agent, idle and while relaying 50 concurrent streams.

Starts a simulated phone (`fleetgate-agent --engine sim`, 64 slots) and, in front of it,
`fleetgate-agent --engine llama` attached to it as to a llama-server (the relay under
test; it also reads the engine's /slots every second for progress reports; `--engine
openai` relays without that); reads the relay's VmRSS from
/proc after one warm-up request (idle), then opens N streamed chat completions at once
(each 200 tokens at 20 tok/s: 10 s) and samples VmRSS every 100 ms while all of them are
in flight, then once more after they ended. VmRSS counts the shared libraries' pages the
process touched (libcrypto, libcurl and its many dependencies on a desktop distribution);
RssAnon is the agent's own private memory. Prints one JSON object; --markdown prints a
table row for docs/benchmarks.md.

usage: tests/bench/agent_rss.py [--agent BIN] [--engine llama|openai] [--streams N] [--markdown]
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parents[2]
TOKEN = "bench-replica-token-0123456789"


def free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def wait_port(port, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((HOST, port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def rss_kb(pid, key="VmRSS"):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return None


def http(port, method, path, body=None, stream=False, timeout=30):
    """A minimal HTTP/1.1 client (no third-party modules): returns (status, body bytes);
    for a stream, reads until the server ends it and counts the SSE events."""
    data = json.dumps(body).encode() if body is not None else b""
    head = (f"{method} {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n")
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(head.encode() + data)
        got = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            got += b
    status = int(got.split(b" ", 2)[1]) if got.startswith(b"HTTP/") else 0
    return status, got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent", default=os.environ.get("FLEETGATE_AGENT_BIN",
                                                       str(ROOT / "build/agent/fleetgate-agent")))
    ap.add_argument("--engine", choices=("llama", "openai"), default="llama")
    ap.add_argument("--streams", type=int, default=50)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()

    sim_port, agent_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETGATE_")}
    procs = []
    try:
        sim = subprocess.Popen([a.agent, "--engine", "sim", "--listen", f"{HOST}:{sim_port}", "--model", "m",
                                "--slots", "64", "--prefill-tps", "2000", "--decode-tps", "20",
                                "--n-ctx", "8192", "--log-level", "warn"],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(sim)
        agent = subprocess.Popen([a.agent, "--engine", a.engine, "--listen", f"{HOST}:{agent_port}",
                                  "--upstream", f"http://{HOST}:{sim_port}", "--log-level", "warn"],
                                 env={**env, "FLEETGATE_REPLICA_TOKEN": TOKEN},
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(agent)
        if not (wait_port(sim_port) and wait_port(agent_port)):
            sys.exit("the sim or the agent did not start")
        for _ in range(100):  # until the agent has seen the engine ready
            st, body = http(agent_port, "GET", "/agent/v1/status")
            if st == 200 and b'"engine_state":"ready"' in body:
                break
            time.sleep(0.1)
        chat = {"model": "m", "messages": [{"role": "user", "content": "warm up"}], "max_tokens": 4}
        assert http(agent_port, "POST", "/v1/chat/completions", chat)[0] == 200
        time.sleep(0.5)
        idle = rss_kb(agent.pid)
        idle_anon = rss_kb(agent.pid, "RssAnon")

        results = []
        stream_body = dict(chat, max_tokens=a.tokens, stream=True)

        def one(i):
            b = dict(stream_body, messages=[{"role": "user", "content": f"stream {i}"}])
            st, got = http(agent_port, "POST", "/v1/chat/completions", b, timeout=120)
            results.append((st, got.count(b"data: "), got.rstrip().endswith(b"data: [DONE]")
                            or b"data: [DONE]" in got))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(a.streams)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        samples, anon = [], []
        busy_seen = 0
        while any(t.is_alive() for t in threads) and time.monotonic() - t0 < 120:
            samples.append(rss_kb(agent.pid))
            anon.append(rss_kb(agent.pid, "RssAnon"))
            if len(samples) % 10 == 5:
                st, body = http(agent_port, "GET", "/agent/v1/status")
                busy_seen = max(busy_seen, json.loads(body.split(b"\r\n\r\n", 1)[1])["busy"])
            time.sleep(0.1)
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
        after = rss_kb(agent.pid)
        hwm = rss_kb(agent.pid, "VmHWM")
        ok = sum(1 for st, _, done in results if st == 200 and done)
        out = {"engine": a.engine, "streams": a.streams, "tokens_per_stream": a.tokens, "completed": ok,
               "max_busy_seen": busy_seen, "seconds": round(elapsed, 1),
               "rss_idle_kb": idle, "rss_relaying_max_kb": max(samples) if samples else None,
               "rss_after_kb": after, "vm_hwm_kb": hwm,
               "anon_idle_kb": idle_anon, "anon_relaying_max_kb": max(anon) if anon else None,
               "file_backed_idle_kb": idle - idle_anon}
        if a.markdown:
            print(f"| {a.streams} | {ok} | {idle / 1024:.1f} MiB | {out['rss_relaying_max_kb'] / 1024:.1f} MiB | "
                  f"{idle_anon / 1024:.1f} MiB | {out['anon_relaying_max_kb'] / 1024:.1f} MiB |")
        else:
            print(json.dumps(out))
        if ok != a.streams:
            sys.exit(f"only {ok} of {a.streams} streams completed")
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
