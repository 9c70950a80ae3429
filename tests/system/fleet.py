"""Helpers for fleetgate's system tests: start the real daemons on ports picked free at run
time, stop them cleanly whatever happens, and read what they answer (JSON shapes compared
with llama-server's captures, SSE streams, Prometheus text). Standard library + requests."""

import atexit
import json
import os
import re
import shutil
import signal
import random
import socket
import subprocess
import time
from pathlib import Path

import requests

HOST = "127.0.0.1"
# The tests' phones and agents are http:// on loopback, which the URL policy refuses unless
# told (docs/security.md, "URL policy"): every test gateway's "upstream" section says so.
ALLOW_LOOPBACK = {"allow_http": True, "allow_addresses": ["127.0.0.0/8", "::1/128"]}
HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
SOURCE_ROOT = Path(os.environ.get("FLEETGATE_SOURCE_ROOT") or HERE.parents[1])

VALGRIND_CMD = ["valgrind", "--error-exitcode=99", "--leak-check=full",
                "--errors-for-leak-kinds=definite", "-q"]

# Variables a daemon reads that must come from the test, never from whoever runs pytest.
_SCRUBBED_ENV = ("FLEETGATE_REPLICA_TOKEN", "FLEETGATE_FLEET_SECRET")


# ---------------------------------------------------------------------------- binaries

def agent_bin():
    return os.environ.get("FLEETGATE_AGENT_BIN") or str(SOURCE_ROOT / "build/agent/fleetgate-agent")


def gateway_bin():
    return os.environ.get("FLEETGATE_BIN") or str(SOURCE_ROOT / "build/gateway/fleetgate")


def under_valgrind():
    return os.environ.get("FLEETGATE_VALGRIND", "").lower() in ("1", "yes", "true")


def time_mult():
    """How much longer than normal the daemons may take (valgrind makes them slow).
    FLEETGATE_TIME_MULT overrides it. Scale upper bounds and schedules with it, never the
    lower bounds a simulated phone must respect."""
    v = os.environ.get("FLEETGATE_TIME_MULT")
    if v:
        return float(v)
    return 5.0 if under_valgrind() else 1.0


def T(seconds):
    """A time bound scaled by time_mult()."""
    return seconds * time_mult()


# ---------------------------------------------------------------------------- tools

NODE_DIR = HERE / "node"


def need_tool(name, why, found=None):
    """What a test needs from outside the project: returns found (default: the path of the
    program `name` on PATH) when it is there. When it is not, the test is skipped with
    why (how to get it), except under CI=true, where it fails: CI installs every tool
    (deploy/setup.sh --test), so a missing one means the run no longer tests what it
    claims to."""
    if found is None:
        found = shutil.which(name)
    if found:
        return found
    import pytest  # here: the benchmarks use this module without pytest
    msg = f"{name} is not installed: {why}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{msg} (CI=true: a missing tool fails the test instead of skipping it)",
                    pytrace=False)
    pytest.skip(msg)


def need_node_openai():
    """node with the openai npm package in tests/system/node (installed from its
    package-lock.json with `npm ci` when missing); returns the folder."""
    why = "deploy/setup.sh --test installs it, or `npm ci` in tests/system/node"
    need_tool("node", why)
    if not (NODE_DIR / "node_modules" / "openai" / "package.json").exists():
        npm = need_tool("npm", why)
        try:
            p = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR,
                               capture_output=True, text=True, timeout=180)
            failed = p.returncode != 0 and f"npm ci failed (rc {p.returncode}): {p.stderr[-500:]}"
        except (OSError, subprocess.TimeoutExpired) as e:
            failed = f"npm ci failed: {e}"
        if failed:
            need_tool("the openai npm package", f"{why}; {failed}", found=False)
    return NODE_DIR


# ---------------------------------------------------------------------------- ports, waiting

def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago (bind port 0, read it, close).
    Another process may take it before the daemon binds: ProcessGroup.spawn retries."""
    return free_ports(1)[0]


_PORT_RNG = random.Random()


def free_ports(n):
    """n distinct such ports, drawn at random from 20000-59999 rather than from the kernel
    (bind to port 0): this kernel hands the port it just freed out again about one time in
    four, so two test workers, or two ports of one daemon, often got the same one. Each
    stays bound until all are picked."""
    socks = []
    try:
        for _ in range(200):
            if len(socks) == n:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((HOST, _PORT_RNG.randrange(20000, 60000)))
            except OSError:
                s.close()
                continue
            socks.append(s)
        if len(socks) < n:
            raise OSError("no free port found in 20000-59999")
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_accepts(port, timeout=0.25):
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def listening_inodes(port):
    """The inodes of the sockets listening on port at 127.0.0.1 or any address (IPv4 or
    IPv6), from /proc/net/tcp{,6}; None when neither can be read."""
    rows, read = [], False
    for name in ("tcp", "tcp6"):
        try:
            rows += Path(f"/proc/net/{name}").read_text().splitlines()[1:]
            read = True
        except OSError:
            pass
    if not read:
        return None
    out = set()
    for row in rows:
        f = row.split()
        if len(f) < 10 or f[3] != "0A" or ":" not in f[1]:  # LISTEN
            continue
        addr, hexport = f[1].rsplit(":", 1)
        if int(hexport, 16) == port and (addr.endswith("0100007F") or set(addr) == {"0"}):
            out.add(f[9])
    return out


def session_pids(sid):
    """The processes of session sid (a daemon started with start_new_session and whatever
    it started: the kit's run.sh starts the agent, the agent its engine)."""
    out = []
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            stat = Path(f"/proc/{e}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 3 and fields[3] == str(sid):
            out.append(int(e))
    return out


def port_listened_by(pid, port):
    """Whether the session of process pid holds the socket listening on port (not another
    process that took the port between free_ports() and the daemon's bind). Falls back to
    a connection when /proc cannot tell."""
    inodes = listening_inodes(port)
    if inodes is None:
        return port_accepts(port)
    if not inodes:
        return False
    for p in session_pids(pid) or [pid]:
        try:
            fds = os.listdir(f"/proc/{p}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{p}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                return True
    return False


def wait_until(pred, timeout, interval=0.05, what="condition"):
    """Poll pred() until it returns something truthy (returned) or timeout seconds pass
    (returns None). Bounded in time and in count."""
    deadline = time.monotonic() + timeout
    max_polls = int(timeout / interval) + 10
    for _ in range(max_polls):
        v = pred()
        if v:
            return v
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)
    return None


# ---------------------------------------------------------------------------- processes

class StartError(Exception):
    pass


_LIVE = set()  # every Daemon still running, killed at interpreter exit as a last resort


@atexit.register
def _kill_leftovers():
    for d in list(_LIVE):
        try:
            d.proc.kill()
            d.proc.wait(timeout=5)
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


class Daemon:
    """One started daemon: its process, ports, log files, and small HTTP helpers."""

    def __init__(self, name, argv, env, proc, ports, stdout_path, stderr_path, check_exit):
        self.name = name
        self.argv = argv
        self.env = env
        self.proc = proc
        self.ports = ports
        self.stdout_path = stdout_path
        self.stderr_path = stderr_path
        self.started_at = time.monotonic()
        self.check_exit = check_exit  # teardown asserts exit code 0 after SIGTERM
        self.headers = {}             # sent with every request made through request()
        self.stopped_rc = None
        self.killed = False
        self.signalled = False        # a test sent it a signal itself
        self.ready_after = None       # seconds from start until it was ready

    @property
    def port(self):
        return self.ports[0]

    @property
    def url(self):
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc.poll() is None

    def elapsed(self):
        """Seconds since the process was started."""
        return time.monotonic() - self.started_at

    def sleep_until(self, t):
        """Sleep until the daemon's own clock, started somewhere between our start of the
        process and its readiness, has surely passed t seconds."""
        left = t + (self.ready_after or 0.0) - self.elapsed()
        if left > 0:
            time.sleep(left)

    def logs(self, tail=6000):
        out = []
        for label, p in (("stdout", self.stdout_path), ("stderr", self.stderr_path)):
            try:
                text = Path(p).read_text(errors="replace")
            except OSError:
                text = ""
            out.append(f"--- {self.name} {label} ({p}) ---\n{text[-tail:]}")
        return "\n".join(out)

    def send_signal(self, sig):
        if self.alive():
            self.signalled = True
            self.proc.send_signal(sig)

    def wait_exit(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout=None):
        """SIGTERM, then SIGKILL after a bounded wait. Returns the exit code (negative for
        a signal, as subprocess reports it)."""
        if timeout is None:
            timeout = T(10)
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            rc = self.wait_exit(timeout)
            if rc is None:
                self.killed = True
                self.proc.kill()
                rc = self.wait_exit(10)
        rc = self.proc.returncode
        self.stopped_rc = rc
        _LIVE.discard(self)
        return rc

    # -- HTTP through requests; a fresh connection per call, so a test controls reuse
    def request(self, method, path, headers=None, auth=True, timeout=None, **kw):
        h = dict(self.headers) if auth else {}
        h.update(headers or {})
        return requests.request(method, self.url + path, headers=h,
                                timeout=timeout if timeout is not None else T(15), **kw)

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, **kw):
        return self.request("POST", path, **kw)

    def metrics(self, **kw):
        r = self.get("/metrics", **kw)
        assert r.status_code == 200, r.text
        return parse_prometheus(r.text)

    def __repr__(self):
        return f"<Daemon {self.name} pid={self.proc.pid} ports={self.ports}>"


_ADDR_IN_USE = re.compile(r"address already in use|address in use|eaddrinuse", re.I)


class ProcessGroup:
    """The daemons one test started. stop_all() stops every one of them, newest first, and
    returns the problems it saw (unexpected exit codes) so the fixture can fail the test."""

    def __init__(self, workdir):
        self.workdir = Path(workdir)
        self.daemons = []
        self._seq = 0

    def spawn(self, name, make_argv, n_ports=1, env=None, ready=None, ready_timeout=10.0,
              attempts=3, check_exit=True, valgrind=None):
        """Start a daemon. make_argv(ports) builds its command line from n_ports free ports
        (called again with new ports on a retry). Ready when every port accepts a
        connection and then ready(daemon) (if given) returns truthy, within
        T(ready_timeout) seconds; retried on 'address in use'."""
        if valgrind is None:
            valgrind = under_valgrind()
        if valgrind:
            need_tool("valgrind", "FLEETGATE_VALGRIND runs the daemons under it (apt-get install valgrind)")
        full_env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        full_env.update(env or {})
        if "FLEETGATE_AGENT_SYSROOT" not in full_env:
            # agents read an empty /sys and /proc unless a test gives them a tree: this
            # machine's battery and heat would otherwise steer the gateway's routing
            # (scheduler.device) and the results would depend on where the tests run
            (self.workdir / "no-sysfs").mkdir(exist_ok=True)
            full_env["FLEETGATE_AGENT_SYSROOT"] = str(self.workdir / "no-sysfs")
        last_err = None
        for attempt in range(attempts):
            self._seq += 1
            ports = free_ports(n_ports)
            argv = [str(a) for a in make_argv(ports)]
            if valgrind:
                argv = VALGRIND_CMD + argv
            base = self.workdir / f"{name}.{self._seq}"
            out_path, err_path = Path(f"{base}.stdout"), Path(f"{base}.stderr")
            with open(out_path, "wb") as out, open(err_path, "wb") as err:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                        env=full_env, cwd=self.workdir, start_new_session=True)
            d = Daemon(name, argv, full_env, proc, ports, out_path, err_path, check_exit)
            _LIVE.add(d)
            self.daemons.append(d)
            try:
                self._wait_ready(d, ready, T(ready_timeout))
                return d
            except StartError as e:
                last_err = e
                d.stop(timeout=T(5))
                d.check_exit = False  # reported through the StartError instead
                if not _ADDR_IN_USE.search(Path(err_path).read_text(errors="replace")):
                    break
        raise last_err

    @staticmethod
    def _wait_ready(d, ready, timeout):
        deadline = time.monotonic() + timeout
        pending = list(d.ports)
        for _ in range(int(timeout / 0.02) + 100):
            if not d.alive():
                raise StartError(f"{d.name} exited with {d.proc.returncode} while starting: "
                                 f"{' '.join(d.argv)}\n{d.logs()}")
            # its own listening socket, not another process's that took the port first
            pending = [p for p in pending if not port_listened_by(d.pid, p)]
            if not pending:
                if ready is None or ready(d):
                    d.ready_after = d.elapsed()
                    return
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        raise StartError(f"{d.name} not ready within {timeout:.1f} s (ports {pending} not "
                         f"accepting): {' '.join(d.argv)}\n{d.logs()}")

    def stop_all(self, timeout=None):
        """SIGTERM every daemon still running (newest first), wait for them all up to
        timeout seconds together, SIGKILL the rest."""
        if timeout is None:
            timeout = T(10)
        was_alive = {d: d.alive() for d in self.daemons}
        for d in reversed(self.daemons):
            if was_alive[d]:
                d.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for d in reversed(self.daemons):
            if d.wait_exit(max(0.0, deadline - time.monotonic())) is None:
                d.killed = True
                d.proc.kill()
                d.wait_exit(10)
            d.stopped_rc = d.proc.returncode
            _LIVE.discard(d)
        problems = []
        for d in reversed(self.daemons):
            rc = d.stopped_rc
            if not d.check_exit:
                continue
            if not was_alive[d] and not d.signalled and rc != 0:
                problems.append(f"{d.name} (pid {d.pid}) died during the test with exit code {rc}")
            elif d.killed:
                problems.append(f"{d.name} (pid {d.pid}) ignored SIGTERM for {timeout:.0f} s and was killed")
            elif rc != 0:
                problems.append(f"{d.name} (pid {d.pid}) exited with {rc} after SIGTERM"
                                + (" (valgrind found errors)" if rc == 99 else ""))
        return problems


def sim_argv(port, model="sim-model", slots=1, prefill_tps=2000, decode_tps=100, n_ctx=None,
             time_scale=None, loading_s=None, fault_plan_file=None, id=None, extra_args=()):
    """The command line of a simulated phone (DESIGN.md's fixed interface)."""
    argv = [agent_bin(), "--engine", "sim", "--listen", f"{HOST}:{port}", "--model", model,
            "--slots", slots, "--prefill-tps", prefill_tps, "--decode-tps", decode_tps]
    if n_ctx is not None:
        argv += ["--n-ctx", n_ctx]
    if time_scale is not None:
        argv += ["--time-scale", time_scale]
    if loading_s is not None:
        argv += ["--loading-s", loading_s]
    if fault_plan_file is not None:
        argv += ["--fault-plan", fault_plan_file]
    if id is not None:
        argv += ["--id", id]
    return argv + list(extra_args)


# ---------------------------------------------------------------------------- prompts

_WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
          "november oscar papa quebec romeo sierra tango uniform victor whiskey xray").split()


def make_prompt(n_tokens, tag="p"):
    """Text of exactly n_tokens * 4 characters (the sim counts characters / 4 as tokens).
    Prompts with different tags differ from their first characters on."""
    n = n_tokens * 4
    parts = [f"[{tag}]"]
    size = len(parts[0])
    i = sum(map(ord, tag))
    while size < n:
        i = (i * 1103515245 + 12345) % 2**31  # a small LCG: varied, repeatable words
        w = _WORDS[(i >> 16) % len(_WORDS)]
        parts.append(w)
        size += len(w) + 1
    return " ".join(parts)[:n]


def chat_body(content, model="sim-model", max_tokens=8, stream=False, include_usage=None, **extra):
    body = {"model": model, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens}
    if stream:
        body["stream"] = True
        if include_usage is not None:
            body["stream_options"] = {"include_usage": include_usage}
    body.update(extra)
    return body


# ---------------------------------------------------------------------------- SSE

class SSEResult:
    def __init__(self):
        self.data = []       # each event's data payload, "[DONE]" included
        self.comments = 0    # ":" keep-alive lines
        self.error = None    # the exception that ended the read, if any
        self.timed_out = False
        self.first_at = None  # monotonic time of the first event
        self.ended_at = None

    @property
    def done(self):
        return bool(self.data) and self.data[-1] == "[DONE]"

    def chunks(self):
        """The JSON payloads (everything but [DONE])."""
        return [json.loads(d) for d in self.data if d != "[DONE]"]


def parse_sse_text(text):
    """Data payloads of a whole SSE body (used for captures)."""
    res = SSEResult()
    _feed_sse(res, text.replace("\r\n", "\n").split("\n") + [""], [])
    return res.data


def _feed_sse(res, lines, pending):
    for line in lines:
        if line == "":
            if pending:
                res.data.append("\n".join(pending))
                if res.first_at is None:
                    res.first_at = time.monotonic()
                pending.clear()
        elif line.startswith(":"):
            res.comments += 1
        elif line.startswith("data:"):
            v = line[5:]
            pending.append(v[1:] if v.startswith(" ") else v)
        # event:, id:, retry: are not used by llama-server


def read_sse(resp, timeout=None, max_events=100000, stop_after=None):
    """Read a streamed requests.Response into an SSEResult: data payloads in order, until
    the server ends the stream, a read fails (kept in .error), timeout seconds pass, or
    stop_after events were read (the response is left open then)."""
    res = SSEResult()
    deadline = time.monotonic() + (timeout if timeout is not None else T(30))
    buf, pending = "", []
    try:
        for piece in resp.iter_content(chunk_size=None):
            buf += piece.decode("utf-8", errors="replace") if isinstance(piece, bytes) else piece
            buf = buf.replace("\r\n", "\n")
            *lines, buf = buf.split("\n")
            _feed_sse(res, lines, pending)
            if len(res.data) >= max_events or (stop_after and len(res.data) >= stop_after):
                break
            if time.monotonic() > deadline:
                res.timed_out = True
                break
    except (requests.exceptions.RequestException, OSError) as e:
        res.error = e
    res.ended_at = time.monotonic()
    return res


# ---------------------------------------------------------------------------- raw sockets

def raw_exchange(port, data, timeout=5.0, read_limit=1 << 20, half_close=False):
    """Send bytes as they are, read until the server closes, the timeout passes or
    read_limit bytes came. Returns (bytes received, closed_by_server)."""
    got = b""
    closed = False
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        try:
            s.sendall(data)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        deadline = time.monotonic() + timeout
        while len(got) < read_limit and time.monotonic() < deadline:
            s.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                b = s.recv(65536)
            except socket.timeout:
                break
            except OSError:
                closed = True
                break
            if not b:
                closed = True
                break
            got += b
    return got, closed


def http_status(raw):
    """The status code of the first response in raw bytes, or None."""
    m = re.match(rb"HTTP/1\.[01] (\d{3})", raw)
    return int(m.group(1)) if m else None


def http_request_bytes(method, path, body=None, headers=None, port=0):
    body = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    h = {"Host": f"{HOST}:{port}"}
    if body or method == "POST":
        h["Content-Type"] = "application/json"
        h["Content-Length"] = str(len(body))
    h.update(headers or {})
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
    return head.encode() + body


# ---------------------------------------------------------------------------- Prometheus

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)(?:\s+\d+)?$")


def parse_prometheus(text):
    """Samples of a Prometheus text body: {'name' or 'name{labels}': float}."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise ValueError(f"not a Prometheus sample line: {line!r}")
        out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def prometheus_types(text):
    """{'name': 'counter'|'gauge'|...} from the # TYPE lines."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0] == "#" and parts[1] == "TYPE":
            out[parts[2]] = parts[3]
    return out


# ---------------------------------------------------------------------------- captures, shapes

class Capture:
    """A reference .http capture: status, headers (lower-case names), body text."""

    def __init__(self, name):
        text = (FIXTURES / name).read_text()
        head, _, self.body = text.partition("\n\n")
        lines = head.split("\n")
        self.status = int(lines[0].split()[1])
        self.headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            self.headers[k.strip().lower()] = v.strip()

    def json(self):
        return json.loads(self.body)

    def sse(self):
        return parse_sse_text(self.body)


# Keys whose value may be null in one answer and a value in another (llama-server sends
# finish_reason null until the last chunk, content null in the role chunk).
NULLABLE = frozenset({"finish_reason", "content", "logprobs"})


def json_kind(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


def shape_diff(actual, expected, path="$", mode="exact", nullable=NULLABLE):
    """Differences in shape between actual and expected JSON, as 'path: problem' strings
    (empty when they match). At every path both must have the same JSON type, int and
    float both being 'number' and null allowed for the NULLABLE keys. Objects: mode
    'exact' wants the same keys, 'superset' at least the expected keys, 'compatible'
    only compares the keys both have. Array elements are compared with the expected
    array's first element."""
    problems = []
    ka, ke = json_kind(actual), json_kind(expected)
    key = path.rsplit(".", 1)[-1]
    if ka != ke:
        if "null" in (ka, ke) and key in nullable:
            return problems
        return [f"{path}: {ka} where the capture has {ke}"]
    if ke == "object":
        missing = [k for k in expected if k not in actual]
        extra = [k for k in actual if k not in expected]
        if missing and mode in ("exact", "superset"):
            problems.append(f"{path}: missing keys {missing}")
        if extra and mode == "exact":
            problems.append(f"{path}: keys not in the capture {extra}")
        for k in expected:
            if k in actual:
                problems += shape_diff(actual[k], expected[k], f"{path}.{k}", mode, nullable)
    elif ke == "array" and expected:
        for i, el in enumerate(actual):
            problems += shape_diff(el, expected[0], f"{path}[{i}]", mode, nullable)
    return problems


def assert_shape(actual, expected, mode="exact", what="response"):
    problems = shape_diff(actual, expected, mode=mode)
    assert not problems, (f"{what} differs from the capture:\n  " + "\n  ".join(problems)
                          + f"\nactual: {json.dumps(actual)[:2000]}")
