"""The Acurast deployment kit (deploy/acurast/): make-deployment.sh turns an operator's
values into a folder for `acurast deploy`, and the folder's entry script run.sh, run here
in a local stand-in for a phone, fetches and checks what it needs, starts the agent and
joins the gateway through the tunnel.

The stand-in: no arm64 user space and no Acurast processor. run.sh runs on this machine
with the x86-64 agent (make-deployment.sh --arch x86_64 --agent build/...), acubridge's
FakeBridge plays the bridge socket and the tunnel relay, and a local HTTP server plays
GitHub and Hugging Face, serving a llama.cpp-style release archive holding the real
llama-server and the tiny model (tests/system/llama.py). The arm64 folder itself (static
aarch64 agent, aarch64 shim, the manifest) is checked without running it, and its agent's
`fetch` under qemu-user."""

import hashlib
import http.server
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import pytest
import requests

import fleet
import llama
from acubridge import FakeBridge
from fleet import HOST, T

KIT = fleet.SOURCE_ROOT / "deploy/acurast"
MAKE = KIT / "make-deployment.sh"
SECRET = "fleet-secret-for-the-kit-0123456789"
TOKEN = "kit-replica-token-0123456789"
ENV = {"FLEETGATE_FLEET_SECRET": SECRET, "FLEETGATE_REPLICA_TOKEN": TOKEN}
RELAY = "relay.test.invalid:4433"
ZERO = "0" * 64
CHAT = "/v1/chat/completions"
ADMIN_TOKEN = "kit-admin-token-0123456789"
NINE_B = 5680000000  # the seed's 9B at Q4_K_M, in bytes


def sha256(data):
    return hashlib.sha256(data).hexdigest()


class Files:
    """A local download server: GET /NAME serves files[NAME] (HEAD its size). `cut` names
    files whose first GET sends half the body and hangs up; `ranges` says whether Range
    requests are honoured (206) or ignored (200, the whole file). `requests` records
    (path, Range) of each GET, `heads` the paths asked with HEAD."""

    def __init__(self):
        self.files, self.cut, self.ranges, self.requests, self.heads = {}, set(), True, [], []
        files = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_HEAD(self):
                name = self.path.lstrip("/")
                files.heads.append(name)
                body = files.files.get(name)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body) if body is not None else 0))
                self.end_headers()

            def do_GET(self):
                name = self.path.lstrip("/")
                rng = self.headers.get("Range")
                files.requests.append((name, rng))
                body = files.files.get(name)
                if body is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                start = 0
                m = re.fullmatch(r"bytes=(\d+)-", rng or "")
                if m and files.ranges:
                    start = int(m.group(1))
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                if name in files.cut:
                    files.cut.discard(name)
                    self.wfile.write(body[start:start + (len(body) - start) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body[start:])

        self.server = http.server.ThreadingHTTPServer((HOST, 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{HOST}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, name, data):
        self.files[name] = data
        return f"{self.url}/{name}", sha256(data)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def files():
    f = Files()
    yield f
    f.close()


@pytest.fixture
def bridge(tmp_path):
    b = FakeBridge(tmp_path)
    yield b
    b.close()


def make(out, *args, arch="x86_64", agent=None, env=None, check=True):
    """make-deployment.sh OUT ...; the x86-64 stand-in unless arch says otherwise."""
    argv = [str(MAKE), "--out", str(out), "--arch", arch,
            "--agent", str(agent or fleet.agent_bin()),
            "--image-url", "https://example.invalid/ubuntu-aarch64-pd.tar.xz", "--image-sha256", ZERO,
            "--max-cost", "1000000000", *[str(a) for a in args]]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=T(120), stdin=subprocess.DEVNULL,
                       env=dict(os.environ, **(env or {})))
    if check:
        assert p.returncode == 0, p.stdout + p.stderr
    return p


def gw_config(port, ca_file, admin_port=None):
    c = {
        "listen": [{"address": f"{HOST}:{port}"}],
        "fleet": {"secret_env": "FLEETGATE_FLEET_SECRET", "replica_token_env": "FLEETGATE_REPLICA_TOKEN",
                  "heartbeat_timeout_s": 60, "heartbeat_interval_s": 20},
        "health": {"interval_s": 0.5, "timeout_s": 2, "rise": 1, "fall": 2, "readyz_counts": True},
        "upstream": dict(fleet.ALLOW_LOOPBACK, ca_file=ca_file),
        "queue": {"max": 100, "timeout_s": 60},
        "scheduler": {"retries": 2, "default_max_tokens": 16},
        "log_level": "info",
        "replicas": [],
    }
    if admin_port:
        c["admin"] = {"listen": f"{HOST}:{admin_port}", "token": ADMIN_TOKEN}
    return c


def admin_get(g, path):
    """The gateway's admin API (gw_config with admin_port: the gateway's ports[1])."""
    r = requests.get(f"http://{HOST}:{g.ports[1]}{path}", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                     timeout=T(5))
    assert r.status_code == 200, r.text
    return r.json() if path != "/metrics" else r.text


def phone_root(tmp_path, mem_total_kb, name="phone-root"):
    """A phone's /proc as the agent reads it (FLEETGATE_AGENT_SYSROOT): its memory."""
    root = tmp_path / name
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc/meminfo").write_text(f"MemTotal: {mem_total_kb} kB\nMemFree: 204800 kB\n"
                                       f"MemAvailable: {mem_total_kb // 2} kB\n")
    return root


def readyz(g):
    try:
        return requests.get(g.url + "/readyz", timeout=1).json().get("replicas_ready") or 0
    except (requests.RequestException, ValueError):
        return 0


def registered_urls(g):
    """(id, url) the gateway took from heartbeats, in order (from its log)."""
    out = []
    for line in Path(g.stderr_path).read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            r = json.loads(line)
        except ValueError:
            continue
        m = str(r.get("msg", ""))
        if m == "replica registered by heartbeat":
            out.append((r.get("replica"), r.get("url")))
        mm = re.match(r"replica (\S+) now at (\S+)$", m)
        if mm:
            out.append((mm.group(1), mm.group(2)))
    return out


def phone_env(bridge, home, **extra):
    env = {"BRIDGE_SOCKET": bridge.name, "FLEETGATE_FLEET_SECRET": SECRET, "HOME": str(home),
           "FLEETGATE_TUNNEL_KEY": ""}
    env.update(extra)
    return env


def start_run_sh(procs, tmp_path, bridge, make_kit, n_ports=1, ready_timeout=20, name="phone", env=None):
    """Spawn deployment/run.sh; make_kit(ports) writes the folder for these ports first
    (the agent's listener is fixed in kit.conf). Returns (daemon, deployment folder)."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    where = {}

    def argv(ports):
        where["dep"] = make_kit(ports) / "deployment"
        return ["/bin/sh", where["dep"] / "run.sh"]

    d = procs.spawn(name, argv, n_ports=n_ports, env=phone_env(bridge, home, **(env or {})),
                    ready_timeout=ready_timeout, valgrind=False)
    return d, where["dep"]


def chat(g, text, model):
    r = requests.post(g.url + CHAT, json=fleet.chat_body(text, model=model, max_tokens=3), timeout=T(60))
    assert r.status_code == 200, r.text
    return r


# ---- make-deployment.sh ---------------------------------------------------------------------


def arm64_agent():
    return Path(os.environ.get("FLEETGATE_AGENT_ARM64_BIN")
                or fleet.SOURCE_ROOT / "build-phone-arm64/agent/fleetgate-agent")


@pytest.mark.once
def test_the_arm64_folder_holds_a_manifest_the_phone_programs_and_no_secret(tmp_path):
    agent = arm64_agent()
    fleet.need_tool("the arm64 agent", f"no {agent}: deploy/build-agent-phone.sh --arch arm64 (deploy/test.sh "
                    "builds it)", found=str(agent) if agent.is_file() else "")
    fleet.need_tool("aarch64-linux-gnu-gcc", "the shim is built for the phones (apt-get install crossbuild-essential-arm64)")
    fleet.need_tool("file", "apt-get install file")
    out = tmp_path / "kit"
    p = make(out, "--gateway", "https://gw.example.com", "--model", "qwen3.5-9b",
             "--model-url", "https://huggingface.co/o/r/resolve/main/q.gguf", "--model-sha256", "ab" * 32,
             "--llama-url", "https://github.com/ggml-org/llama.cpp/releases/download/b6000/"
             "llama-b6000-bin-ubuntu-arm64.tar.gz", "--llama-sha256", "cd" * 32,
             "--replicas", "20", "--days", "3", "--secret-env", "EXTRA_SECRET", "--parallel", "2",
             "--model-bytes", NINE_B, arch="arm64", agent=agent,
             env={"FLEETGATE_FLEET_SECRET": SECRET, "EXTRA_SECRET": "extra-secret-value-42"})
    assert "export FLEETGATE_FLEET_SECRET=..." in p.stdout
    m = json.loads((out / "acurast.json").read_text())
    (name, proj), = m["projects"].items()
    assert name == proj["projectName"] == "fleetgate-qwen3.5-9b"
    assert proj["runtime"] == "Shell" and proj["requiredModules"] == ["Shell"]
    assert proj["fileUrl"] == "deployment" and proj["entrypoint"] == "run.sh"
    assert proj["image"] == {"url": "https://example.invalid/ubuntu-aarch64-pd.tar.xz", "sha256": ZERO}
    assert proj["minProcessorVersions"] == {"android": "1.26.0"}
    assert proj["numberOfReplicas"] == 20 and proj["maxCostPerExecution"] == 1000000000
    assert proj["execution"] == {"type": "onetime", "maxExecutionTimeInMs": 3 * 86400000}
    assert proj["assignmentStrategy"]["type"] == "Single"  # Competing cannot carry env vars
    assert proj["includeEnvironmentVariables"] == ["EXTRA_SECRET", "FLEETGATE_FLEET_SECRET"]
    dep = out / "deployment"
    assert sorted(x.name for x in dep.iterdir()) == ["ca.pem", "fleetgate-agent", "kit.conf",
                                                    "libfgifaddrs.so", "run.sh"]
    # secrets: only their names, anywhere in the folder
    for f in out.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert SECRET.encode() not in data and b"extra-secret-value-42" not in data, f
    conf = (dep / "kit.conf").read_text()
    assert "FG_GATEWAY='https://gw.example.com'" in conf and "FG_PARALLEL='2'" in conf
    assert "FG_TUNNEL_RELAYS='relay-1.mainnet.acurast.com:4433'" in conf
    assert "FG_TUNNEL_DOMAIN='acu.run'" in conf
    kinds = {f: subprocess.run(["file", "-b", str(dep / f)], capture_output=True, text=True).stdout
             for f in ("fleetgate-agent", "libfgifaddrs.so")}
    assert "ARM aarch64" in kinds["fleetgate-agent"] and "statically linked" in kinds["fleetgate-agent"], kinds
    assert "ARM aarch64" in kinds["libfgifaddrs.so"] and "shared object" in kinds["libfgifaddrs.so"], kinds
    # the shim loads into any glibc userland from 2.17 (aarch64's first) on
    syms = subprocess.run(["aarch64-linux-gnu-objdump", "-T", str(dep / "libfgifaddrs.so")],
                          capture_output=True, text=True).stdout
    versions = set(re.findall(r"GLIBC_([0-9.]+)", syms))
    assert versions == {"2.17"}, syms
    if shutil.which("qemu-aarch64-static") or os.environ.get("CI"):
        fleet.need_tool("qemu-aarch64-static", "apt-get install qemu-user-static")
        r = subprocess.run(["qemu-aarch64-static", str(dep / "fleetgate-agent"), "fetch", "--help"],
                           capture_output=True, text=True, timeout=T(30))
        assert r.returncode == 0 and "SHA256" in r.stdout, r.stdout + r.stderr


@pytest.mark.once
@pytest.mark.parametrize("args,said", [
    (["--gateway", "gw.example.com"], "--gateway"),
    (["--gateway", "https://gw.example.com", "--model", "bad name"], "--model"),
    (["--gateway", "https://gw.example.com", "--model", "m", "--model-url", "https://x/m.gguf",
      "--model-sha256", "abc", "--llama-url", "https://x/l.tar.gz", "--llama-sha256", ZERO], "--model-sha256"),
    (["--gateway", "https://gw.example.com", "--model", "m", "--engine", "sim", "--replicas", "2",
      "--keep-url"], "--keep-url"),
    (["--gateway", "https://gw.example.com", "--model", "m", "--engine", "sim", "--listen-port", "443"],
     "--listen-port"),
    (["--gateway", "https://gw.example.com", "--model", "m", "--engine", "sim", "--secret-env", "NOT-A-NAME"],
     "--secret-env"),
    (["--gateway", "https://gw.example.com", "--model", "m", "--engine", "sim", "--sim-args", "--slots 2; rm -rf /"],
     "--sim-args"),
    (["--gateway", "https://gw.example.com'\"", "--model", "m", "--engine", "sim"], "--gateway"),
    (["--gateway", "https://gw.example.com", "--model", "m", "--engine", "sim", "--network", "testnet"],
     "--network"),
    (["--gateway", "https://gw.example.com", "--model", "m", "--model-url", "https://x/m.gguf", "--model-sha256", ZERO,
      "--llama-url", "https://x/l.tar.gz", "--llama-sha256", ZERO, "--model-bytes", "5.6GB"], "--model-bytes"),
    # without --model-bytes the model's server is asked its size: one that does not answer
    (["--gateway", "https://gw.example.com", "--model", "m", "--model-url", "http://127.0.0.1:9/m.gguf",
      "--model-sha256", ZERO, "--llama-url", "https://x/l.tar.gz", "--llama-sha256", ZERO], "--model-bytes"),
])
def test_make_deployment_refuses_bad_values_before_writing(tmp_path, args, said):
    out = tmp_path / "kit"
    p = make(out, *args, check=False)
    assert p.returncode == 2, p.stdout + p.stderr
    assert said in p.stderr, p.stderr
    assert not out.exists()


@pytest.mark.once
def test_keep_url_names_the_identity_and_tunnel_keys_for_one_phone(tmp_path):
    out = tmp_path / "kit"
    make(out, "--gateway", "https://gw.example.com", "--model", "m", "--engine", "sim", "--keep-url",
         "--network", "canary")
    proj = json.loads((out / "acurast.json").read_text())["projects"]["fleetgate-m"]
    assert proj["includeEnvironmentVariables"] == ["FLEETGATE_AGENT_KEY", "FLEETGATE_FLEET_SECRET",
                                                   "FLEETGATE_TUNNEL_KEY"]
    assert proj["network"] == "canary" and proj["numberOfReplicas"] == 1
    conf = (out / "deployment/kit.conf").read_text()
    assert "FG_TUNNEL_RELAYS='relay-2.canary.acurast.com:4433'" in conf
    assert "FG_TUNNEL_DOMAIN='canary.acu.run'" in conf


@pytest.mark.once
@pytest.mark.parametrize("model_bytes,need_mb,ram_gb", [(NINE_B, 7013, 12), (2740000000, 3648, 8), (600000000, 1199, 4)])
def test_next_steps_say_the_cost_in_acu_and_the_phones_a_model_needs(tmp_path, model_bytes, need_mb, ram_gb):
    """NEXT-STEPS.txt turns --max-cost into ACU (the seed's 0.57 ACU a phone-day for 7 days,
    20 phones) and says what a phone needs for the model: the seed's 9B on phones of 12 GB,
    a 4B on 8 GB, a 0.8B on 4 GB."""
    out = tmp_path / "kit"
    p = make(out, "--gateway", "https://gw.example.com", "--model", "m", "--model-url", "https://x/m.gguf",
             "--model-sha256", ZERO, "--llama-url", "https://x/l.tar.gz", "--llama-sha256", ZERO,
             "--model-bytes", model_bytes, "--max-cost", "3990000000000", "--days", "7", "--replicas", "20")
    text = (out / "NEXT-STEPS.txt").read_text()
    assert text in p.stdout
    assert ("maxCostPerExecution 3990000000000 = 3.99 ACU for one phone's whole run (7 day(s): 0.57 ACU a "
            "phone-day); at most 79.8 ACU for 20 phone(s)") in text, text
    assert f"needs {need_mb} MiB: phones of {ram_gb} GB of RAM or more" in text, text
    assert json.loads((out / "acurast.json").read_text())["projects"]["fleetgate-m"]["maxCostPerExecution"] == 3990000000000
    conf = (out / "deployment/kit.conf").read_text()
    assert f"FG_MODEL_BYTES='{model_bytes}'" in conf and "FG_NEED_MEM_MB=''" in conf


# ---- run.sh in the local stand-in -----------------------------------------------------------


def test_kit_phone_joins_through_the_tunnel_and_the_gateway_follows_a_new_url(procs, gateway, bridge, tmp_path):
    g = gateway(lambda ports: gw_config(ports[0], bridge.ca_file), env=ENV)

    def kit(ports):
        out = tmp_path / f"kit-{ports[0]}"
        make(out, "--engine", "sim", "--gateway", g.url, "--model", "sim-model", "--id-prefix", "acu-sim",
             "--sim-args", "--slots 2 --prefill-tps 500 --decode-tps 50 --time-scale 10",
             "--listen-port", ports[0], "--tunnel-relay", RELAY, "--tunnel-domain", "localhost",
             "--cost-per-day", "0.57")
        return out

    d, dep = start_run_sh(procs, tmp_path, bridge, kit)
    # run.sh execs the agent: the same process, with the kit's values on its command line
    argv = Path(f"/proc/{d.pid}/cmdline").read_bytes().split(b"\0")
    assert argv[0].endswith(b"fleetgate-agent") and b"--cost-per-day" in argv, argv
    assert argv[argv.index(b"--cost-per-day") + 1] == b"0.57"
    assert fleet.wait_until(lambda: readyz(g) >= 1, T(15)), (g.logs(), d.logs())
    spec = bridge.starts()[0][0]
    assert spec["serverAddrs"] == [RELAY] and spec["domainSuffix"] == "localhost"
    assert spec["localAddr"] == f"{HOST}:{d.port}"
    (pid, url_a), = registered_urls(g)
    assert re.fullmatch(r"acu-sim-[0-9a-f]{8}", pid), pid
    assert url_a == bridge.urls[0]
    relay_a = bridge.relays[0]
    r = chat(g, "through the kit's tunnel", "sim-model")
    assert r.headers["x-fleetgate-replica"] == pid
    assert relay_a.served >= 1

    # the tunnel fails; the agent reopens it, the gateway follows the new URL at once
    served_a = relay_a.served
    bridge.fail()
    assert fleet.wait_until(lambda: len(bridge.urls) >= 2, T(12)), (bridge.calls, d.logs())
    url_b = bridge.urls[1]
    assert url_b != url_a
    assert fleet.wait_until(lambda: (pid, url_b) in registered_urls(g), T(10)), g.logs()
    assert fleet.wait_until(lambda: readyz(g) >= 1, T(10)), g.logs()
    relay_b = bridge.relays[0]
    r = chat(g, "through the new tunnel", "sim-model")
    assert r.headers["x-fleetgate-replica"] == pid
    assert relay_b.served >= 1 and relay_a.served == served_a


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """The kit runs today's engine: b10587 with the tiny Qwen3.5 (the seed's architecture)."""
    try:
        return llama.prepare(tmp_path_factory.mktemp("kit-llama"), release="2026")
    except llama.EngineMissing as e:
        if llama.in_ci():
            pytest.fail(f"CI=true and the real llama-server cannot run: {e}", pytrace=False)
        pytest.skip(f"real llama-server not available: {e}")


def release_archive(engine):
    """A llama.cpp-style release archive: build/bin/llama-server inside a top folder."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        t.add(engine.bin, arcname="llama-b10587-bin-ubuntu-x64/build/bin/llama-server")
    return buf.getvalue()


def llama_kit(out, g, files, engine, ports, model_sha=None):
    llama_url, llama_sha = files.add("llama-b10587-bin-ubuntu-x64.tar.gz", release_archive(engine))
    model_url, real_sha = files.add("tiny-qwen35.gguf", engine.model.read_bytes())
    make(out, "--gateway", g.url, "--model", llama.MODEL, "--id-prefix", "acu-llama",
         "--llama-url", llama_url, "--llama-sha256", llama_sha,
         "--model-url", model_url, "--model-sha256", model_sha or real_sha,
         "--parallel", "2", "--ctx", "2048", "--threads", "1,2", "--llama-arg", "--jinja",
         "--listen-port", ports[0], "--llama-port", ports[1],
         "--tunnel-relay", RELAY, "--tunnel-domain", "localhost")
    return out


def test_kit_fetches_checks_and_runs_the_real_llama_server(procs, gateway, bridge, files, engine, tmp_path):
    g = gateway(lambda ports: gw_config(ports[0], bridge.ca_file, ports[1]), n_ports=2, env=ENV)
    files.cut.add("tiny-qwen35.gguf")  # the model's first download breaks halfway: resumed with a Range
    # a phone of 12 GB (MemTotal about 11 GiB): it can hold the model
    root = phone_root(tmp_path, 11534336)
    d, dep = start_run_sh(procs, tmp_path, bridge,
                          lambda ports: llama_kit(tmp_path / f"kit-{ports[0]}", g, files, engine, ports),
                          n_ports=2, ready_timeout=90, env={"FLEETGATE_AGENT_SYSROOT": str(root)})
    assert fleet.wait_until(lambda: readyz(g) >= 1, T(90)), (g.logs(), d.logs())
    model = engine.model.read_bytes()
    assert [r for n, r in files.requests if n == "tiny-qwen35.gguf"][1:] == [f"bytes={len(model) // 2}-"], \
        files.requests
    # make-deployment asked the model's size (HEAD) for the phones' memory check
    assert "tiny-qwen35.gguf" in files.heads
    assert f"FG_MODEL_BYTES='{len(model)}'" in (dep / "kit.conf").read_text()
    work = tmp_path / "home/fleetgate"
    assert (work / f"models/{llama.MODEL}.gguf").read_bytes() == model
    assert not list(work.glob("**/*.part"))
    logs = Path(d.stderr_path).read_text(errors="replace")
    assert f"{llama.MODEL} fits: " in logs, logs[-3000:]

    # the phone says what it holds: the model (its digest from fetch's check: the agent did
    # not read the file again), its memory and storage, in its heartbeats
    digest = sha256(model)
    assert digest in (work / "models/.fleetgate-sha256").read_text()

    def phone():
        reps = admin_get(g, "/admin/v1/replicas")["replicas"]
        return reps[0] if reps and reps[0]["held"] is not None else None
    assert fleet.wait_until(phone, T(30)), g.logs()
    rep = phone()
    assert rep["held"] == [{"name": llama.MODEL, "sha256": digest}], rep
    assert rep["mem_total_mb"] == 11264 and rep["storage_free_mb"] > 0 and rep["loading"] is None, rep
    assert "model file digest" not in Path(d.stderr_path).read_text(errors="replace")
    r = chat(g, "through the kit, the tunnel and llama-server", llama.MODEL)
    assert re.fullmatch(r"acu-llama-[0-9a-f]{8}", r.headers["x-fleetgate-replica"])
    body = r.json()
    assert body["usage"]["prompt_tokens"] > 0
    # today's engine and the seed's model: b10587, a thinking answer (all reasoning here)
    assert body["system_fingerprint"].startswith("b10587-"), body
    assert body["choices"][0]["message"]["reasoning_content"] and body["choices"][0]["message"]["content"] == "", body
    r = requests.post(g.url + CHAT, json=dict(fleet.chat_body("no thinking", model=llama.MODEL, max_tokens=3),
                                              chat_template_kwargs={"enable_thinking": False}), timeout=T(60))
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
    assert "reasoning_content" not in r.json()["choices"][0]["message"], r.text

    # llama-server: started by the agent from the unpacked archive, with the shim preloaded,
    # on loopback behind a key of this run (other apps on the phone cannot use it)
    engine_port = d.ports[1]
    pids = [p for p in os.listdir("/proc") if p.isdigit() and llama.parent_pid(int(p)) == d.pid]
    servers = [p for p in pids if Path(f"/proc/{p}/exe").resolve().name == "llama-server"]
    assert len(servers) == 1, pids
    assert str(work / "llama") in str(Path(f"/proc/{servers[0]}/exe").resolve())
    # the shim is preloaded for it (b10587's test build is static, so only its environment
    # shows it; a release archive's dynamic llama-server maps it)
    environ = Path(f"/proc/{servers[0]}/environ").read_bytes().split(b"\0")
    assert f"LD_PRELOAD={dep / 'libfgifaddrs.so'}".encode() in environ, environ
    cmd = Path(f"/proc/{servers[0]}/cmdline").read_bytes().split(b"\0")
    assert b"--api-key" not in cmd  # the key is in its environment, not on its command line
    r = requests.post(f"http://{HOST}:{engine_port}/v1/chat/completions",
                      json=fleet.chat_body("no key", model=llama.MODEL, max_tokens=1), timeout=T(10))
    assert r.status_code == 401, r.text
    logs = Path(d.stderr_path).read_text(errors="replace")
    assert "threads to try: 1,2" in logs and "tuning done: keeping" in logs, logs[-3000:]


def test_kit_phone_too_small_for_the_model_ends_its_run_once_and_is_listed(gateway, bridge, files, tmp_path):
    """A phone of 8 GB matched to a deployment of the 9B: before downloading anything it
    finds it cannot hold the model, says so to the gateway (listed with the refused
    registrations, reason cannot_hold) and run.sh ends with status 0, which Acurast's
    restartPolicy onFailure does not restart. A phone of 12 GB goes on to its downloads."""
    g = gateway(lambda ports: gw_config(ports[0], bridge.ca_file, ports[1]), n_ports=2, env=ENV)
    ports = fleet.free_ports(2)
    llama_url, llama_sha = files.add("llama-b0000-bin-ubuntu-arm64.tar.gz", b"not a release archive")
    model_url, model_sha = files.add("fraud-9b-q4_k_m.gguf", b"never downloaded by a small phone")
    out = tmp_path / "kit"
    make(out, "--gateway", g.url, "--model", "qwen3.5-9b", "--id-prefix", "acu-small",
         "--llama-url", llama_url, "--llama-sha256", llama_sha, "--model-url", model_url, "--model-sha256", model_sha,
         "--model-bytes", NINE_B, "--listen-port", ports[0], "--llama-port", ports[1],
         "--tunnel-relay", RELAY, "--tunnel-domain", "localhost")
    assert "needs 7013 MiB: phones of 12 GB of RAM or more" in (out / "NEXT-STEPS.txt").read_text()

    def run(mem_total_kb, home):
        home.mkdir()
        env = phone_env(bridge, home, FLEETGATE_AGENT_SYSROOT=str(phone_root(tmp_path, mem_total_kb, home.name + "-root")))
        return subprocess.run(["/bin/sh", str(out / "deployment/run.sh")], capture_output=True, text=True,
                              timeout=T(60), env=dict(os.environ, **env), stdin=subprocess.DEVNULL)

    p = run(7654321, tmp_path / "small")  # MemTotal 7474 MiB: an 8 GB phone
    assert p.returncode == 0, p.stderr
    assert ("cannot hold qwen3.5-9b: it needs 7013 MiB of memory and this phone can give it 5426 MiB "
            "(MemTotal 7474 MiB less 2048 MiB kept for Android)") in p.stderr, p.stderr
    assert "the gateway took the report" in p.stderr and "ending the run (status 0, not restarted)" in p.stderr
    assert files.requests == []  # nothing downloaded, not even llama-server
    assert bridge.starts() == [] and not fleet.port_accepts(ports[0])  # no tunnel, no agent
    (e,) = admin_get(g, "/admin/v1/status")["refused_registrations"]
    assert re.fullmatch(r"acu-small-[0-9a-f]{8}", e["id"]) and e["url"] == "", e
    assert e["reason"].startswith("cannot_hold: cannot hold qwen3.5-9b: it needs 7013 MiB of memory"), e
    assert admin_get(g, "/admin/v1/replicas")["replicas"] == []  # nothing registered
    assert 'fleetgate_registrations_refused_total{reason="cannot_hold"} 1' in admin_get(g, "/metrics")

    p = run(11534336, tmp_path / "big")  # 12 GB: it goes on to download (the archive here is no archive)
    assert "qwen3.5-9b fits: 7013 of" in p.stderr, p.stderr
    assert [n for n, _ in files.requests] == ["llama-b0000-bin-ubuntu-arm64.tar.gz"], files.requests
    assert p.returncode == 1 and "cannot unpack" in p.stderr, p.stderr
    assert len(admin_get(g, "/admin/v1/status")["refused_registrations"]) == 1


def test_kit_phone_too_small_for_the_model_takes_one_of_the_catalogue_it_can_hold(gateway, bridge, files, tmp_path):
    """With placement and a catalogue on the gateway, a phone of 8 GB matched to a deployment
    of the 9B is not sent away: its report of what it cannot hold is answered with the
    catalogue model it can hold (the 4B), run.sh checks that one and goes on to its
    downloads; the report is listed with the refused registrations, saying what it was
    offered (an agent that could not take the offer ends its run all the same). A phone
    of 3 GB holds none of the catalogue: refused once, listed, the reason says so, its run
    ends with status 0."""
    four_url, four_sha = files.add("qwen3.5-4b-q4_k_m.gguf", b"the 4B's file")

    def cfg(ports):
        c = gw_config(ports[0], bridge.ca_file, ports[1])
        c["models"] = [
            {"name": "qwen3.5-0.8b", "url": files.url + "/small.gguf", "sha256": "1" * 64, "size_bytes": 560000000},
            {"name": "qwen3.5-4b", "url": four_url, "sha256": four_sha, "size_bytes": 2740000000, "n_ctx": 4096},
            {"name": "qwen3.5-9b", "url": files.url + "/nine.gguf", "sha256": "9" * 64, "size_bytes": NINE_B,
             "min_ram_mb": 11000}]
        c["placement"] = {"enabled": True}
        return c
    g = gateway(cfg, n_ports=2, env=ENV)
    ports = fleet.free_ports(2)
    llama_url, llama_sha = files.add("llama-b0000-bin-ubuntu-arm64.tar.gz", b"not a release archive")
    model_url, model_sha = files.add("fraud-9b-q4_k_m.gguf", b"never downloaded by a small phone")
    out = tmp_path / "kit"
    make(out, "--gateway", g.url, "--model", "qwen3.5-9b", "--id-prefix", "acu-small",
         "--llama-url", llama_url, "--llama-sha256", llama_sha, "--model-url", model_url, "--model-sha256", model_sha,
         "--model-bytes", NINE_B, "--listen-port", ports[0], "--llama-port", ports[1],
         "--tunnel-relay", RELAY, "--tunnel-domain", "localhost")

    def run(mem_total_kb, home):
        home.mkdir()
        env = phone_env(bridge, home, FLEETGATE_AGENT_SYSROOT=str(phone_root(tmp_path, mem_total_kb, home.name + "-root")))
        return subprocess.run(["/bin/sh", str(out / "deployment/run.sh")], capture_output=True, text=True,
                              timeout=T(60), env=dict(os.environ, **env), stdin=subprocess.DEVNULL)

    p = run(7654321, tmp_path / "small")  # MemTotal 7474 MiB: an 8 GB phone
    assert "cannot hold qwen3.5-9b: it needs 7013 MiB of memory" in p.stderr, p.stderr
    assert "the gateway's placement gives this phone qwen3.5-4b instead of qwen3.5-9b" in p.stderr, p.stderr
    assert "this phone cannot hold qwen3.5-9b; the gateway's placement gives it qwen3.5-4b instead" in p.stderr
    assert "qwen3.5-4b fits: 3648 of 5426 MiB of memory" in p.stderr, p.stderr
    # it goes on to its downloads (the archive here is no archive)
    assert [n for n, _ in files.requests] == ["llama-b0000-bin-ubuntu-arm64.tar.gz"], files.requests
    assert p.returncode == 1 and "cannot unpack" in p.stderr, p.stderr
    (r,) = admin_get(g, "/admin/v1/status")["refused_registrations"]
    assert r["reason"].endswith("; placement offered it qwen3.5-4b instead"), r
    (e,) = [e for e in admin_get(g, "/admin/v1/events?limit=100")["events"] if e["type"] == "phone_cannot_hold"]
    assert e["instead"] == "qwen3.5-4b" and "was offered qwen3.5-4b" in e["message"], e

    files.requests.clear()
    p = run(2867200, tmp_path / "tiny")  # MemTotal 2800 MiB: a 3 GB phone holds none of them
    assert p.returncode == 0 and "ending the run (status 0, not restarted)" in p.stderr, p.stderr
    assert files.requests == []
    e = admin_get(g, "/admin/v1/status")["refused_registrations"]
    assert len(e) == 2, e
    e = [x for x in e if x["reason"].endswith("; nor can it hold any other model of the catalogue")]
    assert len(e) == 1 and e[0]["reason"].startswith("cannot_hold: cannot hold qwen3.5-9b: it needs 7013 MiB of memory"), e


def test_kit_refuses_a_download_whose_checksum_differs(gateway, bridge, files, engine, tmp_path):
    g = gateway(lambda ports: gw_config(ports[0], bridge.ca_file), env=ENV)
    ports = fleet.free_ports(2)
    dep = llama_kit(tmp_path / "kit", g, files, engine, ports, model_sha="ee" * 32) / "deployment"
    home = tmp_path / "home"
    home.mkdir()
    p = subprocess.run(["/bin/sh", str(dep / "run.sh")], capture_output=True, text=True, timeout=T(60),
                       env=dict(os.environ, **phone_env(bridge, home)), stdin=subprocess.DEVNULL)
    assert p.returncode == 1, p.stderr
    assert "sha256 mismatch" in p.stderr and "could not fetch" in p.stderr, p.stderr
    assert not (home / "fleetgate/model.gguf").exists()
    assert not list((home / "fleetgate").glob("*.part"))
    assert not fleet.port_accepts(ports[0])  # no agent started
    assert bridge.starts() == []


@pytest.mark.parametrize("missing,said", [("BRIDGE_SOCKET", "BRIDGE_SOCKET is not set"),
                                          ("FLEETGATE_FLEET_SECRET", "FLEETGATE_FLEET_SECRET is not set")])
def test_run_sh_says_what_the_processor_did_not_provide(bridge, tmp_path, missing, said):
    make(tmp_path / "kit", "--engine", "sim", "--gateway", "https://gw.example.com", "--model", "m")
    env = dict(os.environ, **phone_env(bridge, tmp_path))
    env.pop(missing)
    p = subprocess.run(["/bin/sh", str(tmp_path / "kit/deployment/run.sh")], capture_output=True, text=True,
                       timeout=T(30), env=env, stdin=subprocess.DEVNULL)
    assert p.returncode == 1 and said in p.stderr, p.stderr


# ---- deploy/acurast/rehearse.sh: the same, as an operator runs it ---------------------------------


def rehearse(tmp_path, *args):
    """deploy/acurast/rehearse.sh --dir tmp_path/rehearsal ARGS with this build's binaries;
    returns the finished process and its folder."""
    folder = tmp_path / "rehearsal"
    env = {k: v for k, v in os.environ.items() if k not in ("FLEETGATE_REPLICA_TOKEN", "FLEETGATE_FLEET_SECRET")}
    env.update(FLEETGATE_BIN=fleet.gateway_bin(), FLEETGATE_AGENT_BIN=fleet.agent_bin())
    p = subprocess.run(["bash", str(KIT / "rehearse.sh"), "--dir", str(folder), *[str(a) for a in args]],
                       capture_output=True, text=True, timeout=T(300), env=env, stdin=subprocess.DEVNULL,
                       cwd=fleet.SOURCE_ROOT)
    return p, folder


def rehearsal_stopped(folder):
    """Everything the rehearsal started is gone: its gateway's ports no longer answer."""
    c = json.loads((folder / "gateway.json").read_text())
    ports = [int(c["listen"][0]["address"].rsplit(":", 1)[1]), int(c["admin"]["listen"].rsplit(":", 1)[1])]
    return not any(fleet.port_accepts(p) for p in ports)


@pytest.mark.once
def test_rehearse_sh_runs_the_deployment_with_the_sim(tmp_path):
    p, folder = rehearse(tmp_path, "--engine", "sim")
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"rehearse: the phone joined: rehearsal-[0-9a-f]{8} at https://\w+\.localhost:\d+ - ready",
                     p.stdout), p.stdout
    assert re.search(r"rehearse: answered by rehearsal-[0-9a-f]{8}: '.+' \(\d+ prompt tokens, 12 generated\)",
                     p.stdout), p.stdout
    assert (folder / "kit/acurast.json").is_file() and (folder / "kit/deployment/run.sh").is_file()
    assert "run.sh: engine sim (no downloads)" in (folder / "phone.log").read_text()
    assert rehearsal_stopped(folder)


@pytest.mark.once
def test_rehearse_sh_runs_the_real_llama_server_and_shows_a_phone_too_small(engine, tmp_path):
    p, folder = rehearse(tmp_path, "--engine", "llama", "--llama-server", engine.bin, "--gguf", engine.model)
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"rehearse: answered by rehearsal-[0-9a-f]{8}: .+ \(\d+ prompt tokens, 12 generated\)",
                     p.stdout), p.stdout
    phone = (folder / "phone.log").read_text(errors="replace")
    assert "engine llama:" in phone and "rehearsal-model fits: " in phone, phone[-3000:]
    assert rehearsal_stopped(folder)
    # the same deployment on a phone of 8 GB with the seed's 9B: refused, listed, no restart
    p, folder = rehearse(tmp_path, "--engine", "llama", "--llama-server", engine.bin, "--gguf", engine.model,
                         "--phone-mem-mb", 7474, "--model-bytes", NINE_B)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "the phone's run ended (status 0) before it joined" in p.stdout, p.stdout
    assert re.search(r"rehearsal-[0-9a-f]{8}: cannot_hold: cannot hold rehearsal-model: it needs 7013 MiB of memory "
                     r"and this phone can give it 5426 MiB", p.stdout), p.stdout
    assert "done: the phone refused the model" in p.stdout
    assert rehearsal_stopped(folder)


# ---- the pieces: fetch and the shim ---------------------------------------------------------


def fetch(*args, timeout=60):
    return subprocess.run([fleet.agent_bin(), "fetch", *[str(a) for a in args]], capture_output=True, text=True,
                          timeout=T(timeout), stdin=subprocess.DEVNULL)


def test_fetch_resumes_where_the_server_allows_and_restarts_where_it_does_not(files, tmp_path):
    blob = os.urandom(3 << 20)
    url, digest = files.add("blob", blob)
    files.cut.add("blob")
    p = fetch(url, digest, tmp_path / "a")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "a").read_bytes() == blob
    assert [r for n, r in files.requests] == [None, f"bytes={len(blob) // 2}-"]
    # a server without ranges answers 200 to the resume: the file is fetched again whole
    files.requests.clear()
    files.ranges = False
    files.cut.add("blob")
    p = fetch(url, digest.upper(), tmp_path / "b")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "b").read_bytes() == blob
    assert len(files.requests) == 3, files.requests  # cut, refused resume, whole
    # there already with the right digest: kept, nothing fetched
    files.requests.clear()
    p = fetch(url, digest, tmp_path / "b")
    assert p.returncode == 0 and "already there" in p.stderr and files.requests == []


def test_fetch_fails_cleanly(files, tmp_path):
    url, digest = files.add("blob", b"x" * 5000)
    p = fetch(url, "ab" * 32, tmp_path / "wrong")
    assert p.returncode == 1 and "sha256 mismatch" in p.stderr, p.stderr
    p = fetch(f"{files.url}/nothing", digest, tmp_path / "gone")
    assert p.returncode == 1 and "answered 404" in p.stderr, p.stderr
    p = fetch("--max-bytes", 1000, url, digest, tmp_path / "big")
    assert p.returncode == 1 and "larger than 1000 bytes" in p.stderr, p.stderr
    p = fetch("--tries", 2, f"http://{HOST}:{fleet.free_port()}/x", digest, tmp_path / "refused", timeout=30)
    assert p.returncode == 1 and "gave up after 2 tries" in p.stderr, p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == []  # no output and no .part left
    for bad in (["ftp://x/y", digest, "o"], [url, "xyz", "o"], [url, digest], ["--tries", "0", url, digest, "o"]):
        assert fetch(*bad).returncode == 2, bad


@pytest.mark.once
def test_the_shim_answers_getifaddrs_with_loopback_only(tmp_path):
    make(tmp_path / "kit", "--engine", "sim", "--gateway", "https://gw.example.com", "--model", "m")
    shim = tmp_path / "kit/deployment/libfgifaddrs.so"
    probe = r"""
import ctypes, socket
class ifaddrs(ctypes.Structure): pass
ifaddrs._fields_ = [("next", ctypes.POINTER(ifaddrs)), ("name", ctypes.c_char_p), ("flags", ctypes.c_uint),
                    ("addr", ctypes.c_void_p), ("mask", ctypes.c_void_p), ("u", ctypes.c_void_p),
                    ("data", ctypes.c_void_p)]
libc = ctypes.CDLL(None)
head = ctypes.POINTER(ifaddrs)()
assert libc.getifaddrs(ctypes.byref(head)) == 0
out, p = [], head
while p:
    fam = ctypes.cast(p.contents.addr, ctypes.POINTER(ctypes.c_ushort)).contents.value
    raw = ctypes.string_at(p.contents.addr, 24)
    addr = socket.inet_ntop(socket.AF_INET, raw[4:8]) if fam == socket.AF_INET else socket.inet_ntop(socket.AF_INET6, raw[8:24])
    out.append((p.contents.name.decode(), fam, addr, p.contents.flags & 8))
    p = p.contents.next
libc.freeifaddrs(head)
print(out)
"""
    def probe_with(preload):
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        if preload:
            env["LD_PRELOAD"] = str(preload)
        p = subprocess.run(["/usr/bin/python3", "-c", probe], capture_output=True, text=True, timeout=T(30), env=env)
        assert p.returncode == 0, p.stderr
        return p.stdout.strip()

    assert probe_with(shim) == str([("lo", 2, "127.0.0.1", 8), ("lo", 10, "::1", 8)])
    # the probe reads the real list without the shim (this machine has more than loopback)
    assert "'127.0.0.1'" in probe_with(None) and probe_with(None) != probe_with(shim)
