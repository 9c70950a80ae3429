"""Helpers for running llama.cpp's real llama-server in the system tests (test_llama.py):
where the engine comes from, a private copy of it, its command line, starting it bare or
under `fleetgate-agent --engine llama`, and reading its /slots."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import requests

import fleet
from fleet import HOST, T

ENV_DIR = "FLEETGATE_LLAMA_SERVER_DIR"
MODEL = "qwen3.5-9b"  # the alias every engine serves the tiny model under
TOKEN = "llama-replica-token-0123"
CTX_PER_SLOT = 2048

# The builds under shared/engines/: release -> (folder, model file, the variable that
# may name another folder). "2025" is llama.cpp of February 2025 with a llama-architecture
# model; "2026" is b10587 (August 2026) with a tiny Qwen3.5 (hybrid, thinking) model.
RELEASES = {
    "2025": ("llama-server", "tiny.gguf", ENV_DIR),
    "2026": ("llama-server-qwen35", "tiny-qwen35.gguf", "FLEETGATE_LLAMA_SERVER_QWEN35_DIR"),
}


class EngineMissing(Exception):
    """The engine cannot run here; the message says why and how to fix it."""


def engine_dir(release="2025"):
    """Where the engine and model are: $FLEETGATE_LLAMA_SERVER_DIR (for 2025;
    $FLEETGATE_LLAMA_SERVER_QWEN35_DIR for 2026), else shared/ beside the source tree (CI
    lays a read-only copy of shared/ next to the clone)."""
    folder, _, env = RELEASES[release]
    return Path(os.environ.get(env) or fleet.SOURCE_ROOT.parent / "shared/engines" / folder)


def in_ci():
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


class Engine:
    """A runnable copy of llama-server and its tiny model in a folder of the test run's own."""

    def __init__(self, folder, release="2025"):
        self.folder = Path(folder)
        self.release = release
        self.bin = self.folder / "llama-server"
        self.model = self.folder / RELEASES[release][1]


def _cpu_flags():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def prepare(dest, release="2025"):
    """Copy the engine and model of a release into dest (the source may be read-only) and
    check that the copy runs. Raises EngineMissing with the reason otherwise."""
    src = engine_dir(release)
    _, model, env = RELEASES[release]
    where = f"{src} (set {env} to the folder holding llama-server and {model})"
    for name in ("llama-server", model):
        if not (src / name).is_file():
            raise EngineMissing(f"no {name} in {where}")
    flags = _cpu_flags()
    lacking = sorted({"avx2", "fma", "f16c"} - flags) if flags is not None else []
    if lacking:
        raise EngineMissing(f"this CPU lacks {', '.join(lacking)}, which the llama-server build needs")
    e = Engine(dest, release)
    e.folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "llama-server", e.bin)
    shutil.copyfile(src / model, e.model)
    e.bin.chmod(0o755)
    try:
        p = subprocess.run([str(e.bin), "--version"], capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise EngineMissing(f"{e.bin} (copied from {src}) does not run: {err}") from err
    if p.returncode != 0:
        out = (p.stdout + p.stderr).strip()
        if "libgomp" in out:
            raise EngineMissing("llama-server needs libgomp1 (apt-get install libgomp1, or "
                                f"deploy/setup.sh --test): {out[-300:]}")
        raise EngineMissing(f"{e.bin} --version exited with {p.returncode}: {out[-500:]}")
    return e


def args(engine, port, slots=2, ctx_per_slot=CTX_PER_SLOT, alias=MODEL, threads=1, extra=()):
    """llama-server's arguments: -c is the context of all slots together. One thread each,
    so several engines share a small machine."""
    return [str(a) for a in ["-m", engine.model, "--host", HOST, "--port", port, "-np", slots,
                             "-c", slots * ctx_per_slot, "--alias", alias, "-t", threads,
                             "--metrics", "--slots", "--jinja", *extra]]


def _health_ok(d):
    try:
        return requests.get(d.url + "/health", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def listeners(port):
    """How many TCP sockets listen on this port of the machine (from /proc/net/tcp*)."""
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 3 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                n += 1
    return n


class PortShared(Exception):
    pass


def sole_listener(port, what):
    """llama-server's HTTP library binds with SO_REUSEPORT, so a second engine started on
    a port that another (anyone's) already listens on does not fail: the kernel splits
    the connections between the two. Refuse to test with a shared port."""
    n = listeners(port)
    if n > 1:
        raise PortShared(f"{what}: {n} sockets listen on port {port}")


def start(procs, engine, name="llama", slots=2, attempts=3, **kw):
    """A bare llama-server on a free port, ready once /health answers 200 and it is the
    only listener on its port (else it is stopped and another port tried). check_exit is
    off: this build aborts (exit 134, "terminate called without an active exception")
    on SIGTERM; the test fixture checks instead that none died during the test."""
    last = None
    for _ in range(attempts):
        try:
            d = procs.spawn(name, lambda ports: [engine.bin, *args(engine, ports[0], slots=slots, **kw)],
                            ready=_health_ok, ready_timeout=30, attempts=1, check_exit=False,
                            valgrind=False)
            sole_listener(d.port, name)
        except PortShared as e:
            last = e
            d.stop(timeout=T(5))
            d.signalled = True  # stopped here, not dead
            continue
        except fleet.StartError as e:
            last = e
            if "couldn't bind" in str(e):
                continue
            raise
        d.slots = slots
        d.model = kw.get("alias", MODEL)
        return d
    raise last


def status(d, timeout=None):
    """An agent's /agent/v1/status (asserts a 200)."""
    r = requests.get(d.url + "/agent/v1/status", headers={"Authorization": f"Bearer {TOKEN}"},
                     timeout=timeout or T(10))
    assert r.status_code == 200, (r.status_code, r.text)
    return r.json()


def _engine_ready(d):
    try:
        return status(d, timeout=2)["engine_state"] == "ready"
    except (requests.RequestException, AssertionError, ValueError):
        return False


def start_agent(procs, engine, tmp_path, id, slots=2, **kw):
    """fleetgate-agent --engine llama supervising a llama-server of its own (the agent's
    port and the engine's are both picked free); ready once the agent says the engine is
    ready. d.engine_url is the engine's own address."""

    def argv(ports):
        cfg = {"command": str(engine.bin), "args": args(engine, ports[1], slots=slots, **kw),
               "upstream": f"http://{HOST}:{ports[1]}", "restart_max_s": 2,
               "ready_timeout_s": 60, "stop_timeout_s": 5}
        path = Path(tmp_path) / f"agent-{id}.json"
        path.write_text(json.dumps(cfg, indent=1))
        return [fleet.agent_bin(), "--engine", "llama", "--listen", f"{HOST}:{ports[0]}",
                "--config", path, "--id", id]

    for attempt in range(3):
        d = procs.spawn(id, argv, n_ports=2, env={"FLEETGATE_REPLICA_TOKEN": TOKEN},
                        ready=_engine_ready, ready_timeout=60)
        try:
            sole_listener(d.ports[1], f"{id}'s engine")
            break
        except PortShared:
            if attempt == 2:
                raise
            d.stop()
    d.headers["Authorization"] = f"Bearer {TOKEN}"
    d.id = id
    d.slots = slots
    d.engine_url = f"http://{HOST}:{d.ports[1]}"
    return d


def parent_pid(pid):
    """The parent of process pid, from /proc (None when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def slots(url, timeout=None):
    """llama-server's GET /slots: one object per slot."""
    r = requests.get(url + "/slots", timeout=timeout or T(10))
    assert r.status_code == 200, (r.status_code, r.text[:300])
    return r.json()


def processing(url):
    """How many of the engine's slots are working on a request."""
    return sum(1 for s in slots(url) if s["is_processing"])
