"""Shared helpers for fleetgate's benchmarks (tests/bench/): binaries, free ports, processes
that are always stopped, the peers' configurations (rendered from tests/bench/peers/),
statistics and result files. Standard library only (the load generators add aiohttp).

Every process a benchmark starts is started here and stopped here, by its own handle:
nothing is ever killed by name, so benchmarks run beside other people's tests."""

import atexit
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HOST = "127.0.0.1"
BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parents[1]
PEERS = BENCH / "peers"
RESULTS = Path(os.environ.get("FLEETGATE_BENCH_RESULTS") or BENCH / "results")
NODE_DIR = BENCH / "node"
PROFILES = Path(os.environ.get("FLEETGATE_FLEET_PROFILES") or BENCH / "fleet-profiles.json")


def gateway_bin():
    return os.environ.get("FLEETGATE_BIN") or str(ROOT / "build/gateway/fleetgate")


def agent_bin():
    return os.environ.get("FLEETGATE_AGENT_BIN") or str(ROOT / "build/agent/fleetgate-agent")


def have(cmd):
    return shutil.which(cmd) is not None


def portkey_entry():
    p = NODE_DIR / "node_modules/@portkey-ai/gateway/build/start-server.js"
    return p if p.exists() and have("node") else None


# ------------------------------------------------------------------------------ ports

_taken = set()


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago and that this run has not
    handed out before."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((HOST, 0))
            p = s.getsockname()[1]
        if p not in _taken:
            _taken.add(p)
            return p
    raise RuntimeError("no free port")


def port_accepts(port, timeout=0.2):
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_port(port, timeout=15.0, proc=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_accepts(port):
            return True
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


# ------------------------------------------------------------------------------ processes

class Procs:
    """The processes of one benchmark. stop_all() (also run at exit and on SIGTERM/SIGINT)
    sends SIGTERM to each, waits a bounded time, then SIGKILL: only our own children."""

    def __init__(self):
        self.items = []          # (name, Popen, logfile)
        atexit.register(self.stop_all)

    def spawn(self, name, argv, log=None, env=None, cpu=None, cwd=None):
        if cpu is not None and have("taskset") and os.environ.get("FLEETGATE_BENCH_NOPIN") != "1":
            argv = ["taskset", "-c", str(cpu)] + list(argv)
        lf = open(log, "ab") if log else subprocess.DEVNULL
        e = dict(os.environ)
        for k in ("FLEETGATE_REPLICA_TOKEN", "FLEETGATE_FLEET_SECRET"):
            e.pop(k, None)
        if env:
            e.update(env)
        p = subprocess.Popen(argv, stdout=lf, stderr=subprocess.STDOUT if log else subprocess.DEVNULL,
                             stdin=subprocess.DEVNULL, env=e, cwd=cwd, start_new_session=True)
        self.items.append((name, p, lf))
        return p

    def stop(self, p, timeout=5.0):
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                try:
                    p.kill()
                except ProcessLookupError:
                    pass
                p.wait(5)
        for i, (n, q, lf) in enumerate(self.items):
            if q is p:
                if lf not in (None, subprocess.DEVNULL):
                    lf.close()
                del self.items[i]
                break

    def stop_all(self, timeout=5.0):
        for _, p, _ in list(self.items):
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        for _, p, _ in list(self.items):
            try:
                p.wait(max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for _, p, _ in list(self.items):
            if p.poll() is None:
                try:
                    p.kill()
                    p.wait(5)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass
        for _, _, lf in self.items:
            if lf not in (None, subprocess.DEVNULL):
                lf.close()
        self.items = []


def install_signal_handlers(procs):
    def h(sig, _frm):
        procs.stop_all()
        sys.exit(128 + sig)
    signal.signal(signal.SIGTERM, h)
    signal.signal(signal.SIGINT, h)


def rss_kb(pid):
    """Resident set size of one process, in KiB (VmRSS)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def cpu_ticks(pid):
    """utime+stime of one process, in seconds."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def tree_pids(pid):
    """pid and its descendants (nginx master + workers, node + its threads are one pid)."""
    out = [pid]
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        kids = []
    for k in kids:
        out += tree_pids(int(k))
    return out


def tree_rss_kb(pid):
    vals = [rss_kb(p) for p in tree_pids(pid)]
    vals = [v for v in vals if v is not None]
    return sum(vals) if vals else None


def real_pid(p):
    """The pid of the daemon itself when it was started under taskset (taskset execs, so
    the pid is the same) — kept as a function in case a wrapper is added."""
    return p.pid


# ------------------------------------------------------------------------------ TLS

def make_cert(folder):
    folder = Path(folder)
    cert, key = folder / "cert.pem", folder / "key.pem"
    if not cert.exists():
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key), "-out", str(cert),
                        "-days", "30", "-subj", "/CN=localhost",
                        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                       check=True, capture_output=True, timeout=60)
    return cert, key


# ------------------------------------------------------------------------------ templates

def render(template_name, out_path, **values):
    """Render tests/bench/peers/TEMPLATE with ${name} placeholders into out_path."""
    text = (PEERS / template_name).read_text()
    # safe_substitute: nginx's own $variables stay; a ${name} left over is our mistake.
    out = string.Template(text).safe_substitute(**values)
    left = re.findall(r"\$\{(\w+)\}", out)
    if left:
        raise KeyError(f"{template_name}: no value for {left}")
    Path(out_path).write_text(out)
    return Path(out_path)


_workdirs = []


def workdir(prefix):
    """A scratch folder for rendered configs, logs and pid files; removed at exit unless
    FLEETGATE_BENCH_KEEP=1 (the rendered configs are also copied to results/configs/)."""
    d = Path(tempfile.mkdtemp(prefix=f"fgbench-{prefix}-"))
    _workdirs.append(d)
    return d


def _cleanup_workdirs():
    if os.environ.get("FLEETGATE_BENCH_KEEP") == "1":
        for d in _workdirs:
            print(f"# kept {d}", file=sys.stderr)
        return
    for d in _workdirs:
        shutil.rmtree(d, ignore_errors=True)


atexit.register(_cleanup_workdirs)


def keep_config(bench, path, name=None):
    """Copy a rendered peer config into results/configs/BENCH/ (what was really run)."""
    dst = RESULTS / "configs" / bench
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, dst / (name or Path(path).name))


# ------------------------------------------------------------------------------ statistics

def pct(values, q):
    """q-th percentile (0..100) by linear interpolation; None for no values."""
    v = sorted(values)
    if not v:
        return None
    if len(v) == 1:
        return v[0]
    k = (len(v) - 1) * q / 100.0
    f = int(k)
    c = min(f + 1, len(v) - 1)
    return v[f] + (v[c] - v[f]) * (k - f)


def median(values):
    v = [x for x in values if x is not None]
    return statistics.median(v) if v else None


def pct_served(answered, unanswered, q):
    """q-th percentile (0..100) of a class's latencies counting its requests never answered
    (failed, timed out) as slower than every answer: math.inf when q falls among them. A
    percentile over the answered alone flatters a target that drops its tail (B7: a peer
    that answered 35 of 91 reviews showed a median of its 35 quickest). None for none sent."""
    v = sorted(answered)
    n = len(v) + unanswered
    if n == 0:
        return None
    if n == 1:
        return v[0] if v else math.inf
    k = (n - 1) * q / 100.0
    f = int(k)
    c = min(f + 1, n - 1)
    if f >= len(v) or (c >= len(v) and k > f):
        return math.inf
    return v[f] + (v[c] - v[f]) * (k - f)


def fmt(x, nd=1, unit=""):
    if x is None:
        return "n/a"
    if isinstance(x, float) and math.isinf(x):
        return "unanswered"
    if isinstance(x, float) and abs(x) >= 1000:
        return f"{x:,.0f}{unit}"
    return f"{x:.{nd}f}{unit}"


def table(headers, rows):
    """A Markdown table as a string (printed and pasted into docs)."""
    w = [len(h) for h in headers]
    srows = [[str(c) for c in r] for r in rows]
    for r in srows:
        for i, c in enumerate(r):
            w[i] = max(w[i], len(c))
    line = lambda cells: "| " + " | ".join(c.ljust(w[i]) for i, c in enumerate(cells)) + " |"
    out = [line(headers), "|" + "|".join("-" * (x + 2) for x in w) + "|"]
    out += [line(r) for r in srows]
    return "\n".join(out)


def save_json(name, obj):
    RESULTS.mkdir(parents=True, exist_ok=True)
    p = RESULTS / name
    p.write_text(json.dumps(obj, indent=1, default=str))
    return p


def save_csv(name, headers, rows):
    import csv
    RESULTS.mkdir(parents=True, exist_ok=True)
    p = RESULTS / name
    with open(p, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(headers)
        w.writerows(rows)
    return p


def save_results(benchmark, name, fields, headers, rows):
    """results/NAME.json (fields, stamped with the benchmark, the time, the machine and
    the versions) and results/NAME.csv (the table). Returns the JSON object."""
    out = {"benchmark": benchmark, "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "machine": machine(), "versions": versions(), **fields}
    save_json(name + ".json", out)
    save_csv(name + ".csv", headers, rows)
    return out


def machine():
    info = {"cpus": os.cpu_count()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["mem_gb"] = round(int(line.split()[1]) / 1048576, 1)
    except OSError:
        pass
    info["kernel"] = os.uname().release
    try:
        info["loadavg_at_start"] = Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        pass
    return info


def versions():
    v = {}
    def out(argv):
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
            return (r.stdout + r.stderr).strip().splitlines()[0]
        except Exception:
            return None
    v["fleetgate"] = out([gateway_bin(), "--version"])
    v["nginx"] = out(["nginx", "-v"])
    v["haproxy"] = out(["haproxy", "-v"])
    v["wrk"] = out(["wrk", "--version"])
    v["node"] = out(["node", "--version"])
    pj = NODE_DIR / "node_modules/@portkey-ai/gateway/package.json"
    if pj.exists():
        v["portkey"] = json.loads(pj.read_text()).get("version")
    return v
