"""The gateway as a service an operator installs (docs/deploy.md): `meson install` into a
DESTDIR and the layout it leaves, the systemd unit (systemd-analyze verify and security),
sd_notify readiness through a fake $NOTIFY_SOCKET, secrets from $CREDENTIALS_DIRECTORY,
the certbot deploy hook, and a certificate renewed under load without a failed request."""
import json
import os
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
import requests

import fleet
import gwutil as g
from fleet import HOST, T

SOURCE = fleet.SOURCE_ROOT
UNIT = SOURCE / "deploy/systemd/fleetgate.service"
HOOK = SOURCE / "deploy/certbot-deploy-hook.sh"
ADMIN_TOKEN = "admin-token-0123456789abcdef"


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certs(d, names=("one", "two")):
    """A test CA and a server certificate per name (localhost, 127.0.0.1) it signed: a
    certificate and its renewal."""
    d.mkdir(parents=True, exist_ok=True)
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=fleetgate test CA",
            cwd=d)
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name in names:
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", "/CN=localhost", cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", "san.ext",
                cwd=d)
    return d


def peer_cert(port, ca):
    ctx = ssl.create_default_context(cafile=ca)
    with socket.create_connection((HOST, port), timeout=T(5)) as s:
        with ctx.wrap_socket(s, server_hostname="localhost") as t:
            return t.getpeercert(binary_form=True)


def der(pem_path):
    return ssl.PEM_cert_to_DER_cert(Path(pem_path).read_text())


# ---------------------------------------------------------------------------- sd_notify

class NotifySocket:
    """A stand-in for systemd's notification socket: a datagram socket at a short path
    (or an abstract name), holding what the gateway sends."""

    def __init__(self, abstract=False):
        self.dir = tempfile.mkdtemp(prefix="fg-notify-", dir="/tmp")  # sun_path: 108 bytes
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if abstract:
            name = f"fleetgate-test-{os.getpid()}-{time.monotonic_ns()}"
            self.sock.bind("\0" + name)
            self.env = "@" + name
        else:
            path = os.path.join(self.dir, "notify")
            self.sock.bind(path)
            self.env = path

    def next(self, timeout):
        """The next message as a dict of its assignments (None after timeout seconds)."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(4096).decode()
        except socket.timeout:
            return None
        return dict(line.split("=", 1) for line in data.split("\n") if line)

    def none_within(self, timeout):
        return self.next(timeout) is None

    def close(self):
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def notify():
    socks = []

    def make(abstract=False):
        s = NotifySocket(abstract)
        socks.append(s)
        return s

    yield make
    for s in socks:
        s.close()


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_sd_notify_ready_reload_stopping(sim, gateway, notify, abstract):
    """READY=1 once the listeners accept; SIGHUP: RELOADING=1 (with MONOTONIC_USEC), then
    READY=1 again, also when the new config is refused (the old one still serves, and
    STATUS says so); SIGTERM: STOPPING=1, then a clean exit."""
    ns = notify(abstract)
    phone = g.phone(sim, "p0")
    gw = gateway(lambda ports: g.gw_config(ports[0], [g.replica(phone)]),
                 env={"NOTIFY_SOCKET": ns.env})
    m = ns.next(T(5))
    assert m and m.get("READY") == "1", m
    assert fleet.port_accepts(gw.port)
    assert "serving" in m.get("STATUS", "")
    assert ns.none_within(0.3), "only one READY=1 at start"

    gw.send_signal(signal.SIGHUP)
    m = ns.next(T(5))
    assert m and m.get("RELOADING") == "1", m
    usec = int(m["MONOTONIC_USEC"])
    assert abs(usec / 1e6 - time.clock_gettime(time.CLOCK_MONOTONIC)) < T(5)
    m = ns.next(T(5))
    assert m and m.get("READY") == "1" and "refused" not in m.get("STATUS", ""), m
    fleet.wait_until(lambda: g.log_msgs(gw, "configuration reloaded"), T(5))

    # a broken config: refused, still READY=1, and the gateway still answers
    good = gw.config_path.read_text()
    gw.config_path.write_text("{ not json")
    gw.send_signal(signal.SIGHUP)
    assert ns.next(T(5)).get("RELOADING") == "1"
    m = ns.next(T(5))
    assert m and m.get("READY") == "1" and "refused" in m.get("STATUS", ""), m
    gw.config_path.write_text(good)
    assert g.chat(gw).status_code == 200

    gw.send_signal(signal.SIGTERM)
    m = ns.next(T(5))
    assert m and m.get("STOPPING") == "1", m
    assert gw.wait_exit(T(15)) == 0
    assert ns.none_within(0.2), "nothing after STOPPING=1"


def test_no_notify_socket_no_message(gateway, tmp_path):
    """Without $NOTIFY_SOCKET (not under systemd) the gateway starts and stops as before;
    a NOTIFY_SOCKET that nobody listens on costs a log line at most, never the start."""
    gw = gateway(lambda ports: {"listen": f"{HOST}:{ports[0]}"},
                 env={"NOTIFY_SOCKET": str(tmp_path / "nobody-listens")})
    assert gw.get("/readyz").status_code in (200, 503)
    assert "cannot tell systemd the gateway is ready ($NOTIFY_SOCKET)" in gw.logs(), gw.logs()
    assert gw.stop() == 0


# ---------------------------------------------------------------------------- credentials

def test_secrets_from_credentials_directory(gateway, tmp_path):
    """LoadCredential=env:/etc/fleetgate/credentials gives the gateway
    $CREDENTIALS_DIRECTORY/env_NAME files: each becomes the variable NAME that a *_env key
    names (trailing newline dropped); a variable set in the environment wins."""
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "env_FLEETGATE_ADMIN_TOKEN").write_text(ADMIN_TOKEN + "\n")
    (creds / "FLEETGATE_TEST_SECRET").write_text("from-the-credential-0123456789")
    (creds / "lower_case_is_not_a_variable").write_text("x")
    for f in creds.iterdir():
        f.chmod(0o400)

    def config(ports):
        return {"listen": f"{HOST}:{ports[0]}",
                "admin": {"listen": f"{HOST}:{ports[1]}", "token_env": "FLEETGATE_ADMIN_TOKEN"},
                "fleet": {"secret_env": "FLEETGATE_TEST_SECRET"}}

    env = {"CREDENTIALS_DIRECTORY": str(creds)}
    gw = gateway(config, n_ports=2, env=env)
    admin = f"http://{HOST}:{gw.ports[1]}"
    r = requests.get(admin + "/admin/v1/replicas", timeout=T(5),
                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert r.status_code == 200, r.text
    r = requests.get(admin + "/admin/v1/replicas", timeout=T(5),
                     headers={"Authorization": "Bearer wrong-token-0123456789"})
    assert r.status_code == 401
    logged = g.log_msgs(gw, "credentials: FLEETGATE_ADMIN_TOKEN,FLEETGATE_TEST_SECRET from "
                            "$CREDENTIALS_DIRECTORY") or g.log_msgs(
        gw, "credentials: FLEETGATE_TEST_SECRET,FLEETGATE_ADMIN_TOKEN from $CREDENTIALS_DIRECTORY")
    assert logged, gw.logs()
    assert ADMIN_TOKEN not in gw.logs(), "a secret in the log"
    gw.stop()

    # the environment wins over the credential
    env["FLEETGATE_ADMIN_TOKEN"] = "env-token-0123456789abcdef"
    gw2 = gateway(config, n_ports=2, env=env, name="gateway-env")
    admin = f"http://{HOST}:{gw2.ports[1]}"
    assert requests.get(admin + "/admin/v1/replicas", timeout=T(5), headers={
        "Authorization": "Bearer env-token-0123456789abcdef"}).status_code == 200
    assert requests.get(admin + "/admin/v1/replicas", timeout=T(5), headers={
        "Authorization": f"Bearer {ADMIN_TOKEN}"}).status_code == 401


# ---------------------------------------------------------------------------- the unit

def verify_unit(path, tmp_path):
    """systemd-analyze verify on path, which must be clean: exit 0 and no complaint
    about the unit (it warns about unknown keys and bad values with exit 0)."""
    tool = fleet.need_tool("systemd-analyze", "apt-get install systemd")
    p = subprocess.run([tool, "verify", str(path)], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    complaints = [l for l in (p.stdout + p.stderr).splitlines()
                  if Path(path).name in l or "fleetgate" in l]
    assert p.returncode == 0 and not complaints, f"rc {p.returncode}:\n{p.stdout}{p.stderr}"


def unit_with_binary(src, tmp_path, bindir):
    """A copy of the unit whose ExecStart names existing binaries (verify checks them)."""
    text = Path(src).read_text()
    text = text.replace("/usr/local/bin/", str(bindir).rstrip("/") + "/")
    out = tmp_path / "unit" / "fleetgate.service"
    out.parent.mkdir(exist_ok=True)
    out.write_text(text)
    return out


@pytest.mark.once
def test_unit_passes_systemd_analyze(tmp_path):
    """deploy/systemd/fleetgate.service passes `systemd-analyze verify`, holds what the
    deployment relies on, and `systemd-analyze security` rates it 2.5 or less."""
    text = UNIT.read_text()
    for line in ("Type=notify", "ExecReload=/bin/kill -HUP $MAINPID", "DynamicUser=yes",
                 "StateDirectory=fleetgate", "ConfigurationDirectory=fleetgate",
                 "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
                 "NoNewPrivileges=yes", "CapabilityBoundingSet=CAP_NET_BIND_SERVICE",
                 "AmbientCapabilities=CAP_NET_BIND_SERVICE", "LimitNOFILE=1048576",
                 "LoadCredential=env:/etc/fleetgate/credentials",
                 "ExecStart=/usr/local/bin/fleetgate --config /etc/fleetgate/gateway.json"):
        assert line in text.splitlines(), f"{line} missing from {UNIT}"
    unit = unit_with_binary(UNIT, tmp_path, Path(fleet.gateway_bin()).parent)
    verify_unit(unit, tmp_path)
    tool = fleet.need_tool("systemd-analyze", "apt-get install systemd")
    p = subprocess.run([tool, "security", "--offline=true", str(unit)], capture_output=True,
                       text=True, timeout=60, cwd=tmp_path)
    lines = [l for l in p.stdout.splitlines() if "Overall exposure level" in l]
    assert lines, p.stdout + p.stderr
    score = float(lines[0].split(":")[1].split()[0])
    assert score <= 2.5, lines[0]


# ---------------------------------------------------------------------------- meson install

def build_dir():
    """The build folder the tested gateway comes from (meson's, for `meson install`)."""
    b = Path(fleet.gateway_bin()).resolve().parents[1]
    if not (b / "build.ninja").exists():
        pytest.fail(f"{b} is not a meson build folder (FLEETGATE_BIN={fleet.gateway_bin()})",
                    pytrace=False)
    return b


def meson_paths(meson, b):
    p = subprocess.run([meson, "introspect", str(b), "--buildoptions"], capture_output=True,
                       text=True, timeout=60, check=True)
    opts = {o["name"]: o["value"] for o in json.loads(p.stdout)}
    prefix = Path(opts["prefix"])
    return {k: prefix / opts[k] for k in ("bindir", "sysconfdir", "datadir")} | {
        "prefix": prefix, "unitdir": opts.get("systemdunitdir", "")}


def meson_install(meson, b, dest):
    p = subprocess.run([meson, "install", "-C", str(b), "--no-rebuild", "--destdir", str(dest)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


def under(dest, path):
    return dest / str(path).lstrip("/")


@pytest.mark.once
def test_meson_install_layout(tmp_path):
    """`meson install --destdir` puts the daemons in bin/, the example config, replicas.d/,
    tls/ and credentials/ (0700) in SYSCONFDIR/fleetgate, the unit (with the build's
    paths) in the systemd unit folder, the sysusers file, the certbot hook and the docs;
    a second install keeps every file the operator changed; the installed example
    config is valid once its certificate and token are there."""
    meson = fleet.need_tool("meson", "apt-get install meson")
    b = build_dir()
    paths = meson_paths(meson, b)
    dest = tmp_path / "dest"
    meson_install(meson, b, dest)

    bindir = under(dest, paths["bindir"])
    for exe in ("fleetgate", "fleetgate-agent"):
        assert os.access(bindir / exe, os.X_OK), f"{bindir / exe} missing"
    p = subprocess.run([str(bindir / "fleetgate"), "--version"], capture_output=True, text=True,
                       timeout=10)
    assert p.returncode == 0 and p.stdout.startswith("fleetgate ")

    etc = under(dest, paths["sysconfdir"] / "fleetgate")
    assert (etc / "gateway.json").is_file()
    assert (etc / "replicas.d").is_dir()
    assert (etc / "replicas.d/pixel-01.json.example").is_file()
    assert (etc / "tls").is_dir()
    assert stat.S_IMODE((etc / "credentials").stat().st_mode) == 0o700

    units = list(dest.rglob("systemd/system/fleetgate.service"))
    assert len(units) == 1, units
    unit = units[0]
    if paths["unitdir"]:
        assert unit == under(dest, Path(paths["unitdir"]) / "fleetgate.service")
    text = unit.read_text()
    assert f"ExecStart={paths['bindir']}/fleetgate --config {paths['sysconfdir']}/fleetgate/gateway.json" in text
    assert f"LoadCredential=env:{paths['sysconfdir']}/fleetgate/credentials" in text
    assert list(dest.rglob("sysusers.d/fleetgate.conf"))

    share = under(dest, paths["datadir"])
    assert os.access(share / "fleetgate/certbot-deploy-hook.sh", os.X_OK)
    doc = share / "doc/fleetgate"
    for f in ("README.md", "deploy.md", "configuration.md", "operations.md", "security.md",
              "examples/gateway.json", "images/status-page.png"):
        assert (doc / f).is_file(), f"{doc / f} missing"

    # the installed unit verifies (ExecStart pointed at the installed binary, which
    # verify wants to find)
    verify_unit(_rebased(unit, paths, bindir, tmp_path), tmp_path)

    # an operator's edits survive the next install; what they removed comes back
    (etc / "gateway.json").write_text('{"listen": "127.0.0.1:8080"}\n')
    (etc / "replicas.d/pixel-01.json.example").unlink()
    (etc / "replicas.d/pixel-01.json").write_text("[]\n")
    (etc / "credentials/env_FLEETGATE_ADMIN_TOKEN").write_text("secret\n")
    meson_install(meson, b, dest)
    assert (etc / "gateway.json").read_text() == '{"listen": "127.0.0.1:8080"}\n'
    assert (etc / "replicas.d/pixel-01.json").read_text() == "[]\n"
    assert (etc / "replicas.d/pixel-01.json.example").is_file()
    assert (etc / "credentials/env_FLEETGATE_ADMIN_TOKEN").read_text() == "secret\n"
    assert (doc / "examples/gateway.json").read_text() == (SOURCE / "deploy/etc/gateway.json").read_text()

    # the example configuration is valid with a certificate, a token and a data_dir
    live = tmp_path / "live"
    shutil.copytree(doc / "examples", live)
    (live / "replicas.d").mkdir()
    (live / "tls").mkdir()
    make_certs(live / "tls", names=("server",))
    shutil.copy(live / "tls/server.pem", live / "tls/fullchain.pem")
    shutil.copy(live / "tls/server.key", live / "tls/privkey.pem")
    (live / "data").mkdir()
    cfg = json.loads((live / "gateway.json").read_text())
    assert cfg["data_dir"] == "/var/lib/fleetgate"  # StateDirectory=fleetgate
    cfg["data_dir"] = str(live / "data")
    (live / "gateway.json").write_text(json.dumps(cfg))
    env = dict(os.environ, FLEETGATE_ADMIN_TOKEN=ADMIN_TOKEN)
    p = subprocess.run([str(bindir / "fleetgate"), "--check-config", str(live / "gateway.json")],
                       capture_output=True, text=True, timeout=30, env=env)
    assert p.returncode == 0, p.stdout + p.stderr


def _rebased(unit, paths, bindir, tmp_path):
    text = unit.read_text().replace(f"{paths['bindir']}/", f"{bindir}/")
    out = tmp_path / "unit" / "fleetgate.service"
    out.parent.mkdir(exist_ok=True)
    out.write_text(text)
    return out


# ---------------------------------------------------------------------------- certbot

@pytest.mark.once
def test_certbot_deploy_hook_copies_and_reloads(tmp_path):
    """The hook copies RENEWED_LINEAGE's fullchain.pem and privkey.pem to the gateway's
    tls folder (key not readable by others), then runs the reload; without
    RENEWED_LINEAGE it refuses to run."""
    lineage = tmp_path / "live/gw.example.com"
    lineage.mkdir(parents=True)
    (lineage / "fullchain.pem").write_text("CHAIN\n")
    (lineage / "privkey.pem").write_text("KEY\n")
    dest = tmp_path / "etc/tls"
    marker = tmp_path / "reloaded"
    env = dict(os.environ, RENEWED_LINEAGE=str(lineage), FLEETGATE_TLS_DIR=str(dest),
               FLEETGATE_GROUP="no-such-group-fleetgate-test",
               FLEETGATE_RELOAD=f"touch {marker}")
    p = subprocess.run(["sh", str(HOOK)], capture_output=True, text=True, timeout=30, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (dest / "fullchain.pem").read_text() == "CHAIN\n"
    assert (dest / "privkey.pem").read_text() == "KEY\n"
    assert stat.S_IMODE((dest / "privkey.pem").stat().st_mode) & 0o077 == 0
    assert marker.exists()
    assert sorted(f.name for f in dest.iterdir()) == ["fullchain.pem", "privkey.pem"]
    # the default reload is `systemctl reload fleetgate`
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    (fakebin / "systemctl").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/systemctl-args\n')
    (fakebin / "systemctl").chmod(0o755)
    env.pop("FLEETGATE_RELOAD")
    env["PATH"] = f"{fakebin}:{env['PATH']}"
    p = subprocess.run(["sh", str(HOOK)], capture_output=True, text=True, timeout=30, env=env)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "systemctl-args").read_text() == "reload fleetgate\n"
    env.pop("RENEWED_LINEAGE")
    p = subprocess.run(["sh", str(HOOK)], capture_output=True, text=True, timeout=30, env=env)
    assert p.returncode != 0 and "RENEWED_LINEAGE" in p.stderr


def test_certificate_renewal_under_load_drops_nothing(sim, gateway, tmp_path):
    """Steady HTTPS load through the gateway (new connections and kept-alive ones, whole
    answers and streams) while the certificate files are replaced the way the certbot
    hook does it and the gateway gets SIGHUP: not one request fails, connections opened
    after the reload get the new certificate, and ones opened before keep serving."""
    certs = make_certs(tmp_path / "certs")
    ca = str(certs / "ca.pem")
    live = tmp_path / "tls"
    live.mkdir()
    shutil.copy(certs / "one.pem", live / "fullchain.pem")
    shutil.copy(certs / "one.key", live / "privkey.pem")
    phones = [g.phone(sim, f"p{i}", slots=4, decode_tps=20) for i in range(2)]
    reps = [g.replica(p) for p in phones]

    def config(ports):
        cfg = g.gw_config(ports[0], reps)
        cfg["listen"].append({"address": f"{HOST}:{ports[1]}",
                              "tls": {"cert": str(live / "fullchain.pem"),
                                      "key": str(live / "privkey.pem")}})
        return cfg

    gw = gateway(config, n_ports=2, ready=lambda d: (g.replicas_ready(d) or 0) >= 2)
    port = gw.ports[1]
    url = f"https://localhost:{port}{g.CHAT}"
    assert peer_cert(port, ca) == der(certs / "one.pem")

    stop = threading.Event()
    results = []  # (ok, what, t)
    lock = threading.Lock()

    def record(ok, what):
        with lock:
            results.append((ok, what, time.monotonic()))

    def fresh_connections(i):
        n = 0
        while not stop.is_set():
            n += 1
            stream = n % 3 == 0
            try:
                with requests.Session() as s:  # a new TLS connection each time
                    r = s.post(url, json=fleet.chat_body(f"fresh {i} {n}", model=g.MODEL,
                                                         max_tokens=16, stream=stream),
                               verify=ca, timeout=T(20), stream=stream)
                    if stream:
                        res = fleet.read_sse(r, timeout=T(20))
                        ok = r.status_code == 200 and res.done
                    else:
                        ok = r.status_code == 200 and r.json()["choices"]
                    record(bool(ok), f"fresh {r.status_code}")
            except Exception as e:  # noqa: BLE001 - every failure is counted
                record(False, f"fresh {type(e).__name__}: {e}")

    def kept_alive(i):
        with requests.Session() as s:
            while not stop.is_set():
                try:
                    r = s.post(url, json=fleet.chat_body(f"kept {i}", model=g.MODEL, max_tokens=16),
                               verify=ca, timeout=T(20))
                    record(r.status_code == 200, f"kept {r.status_code}")
                except Exception as e:  # noqa: BLE001
                    record(False, f"kept {type(e).__name__}: {e}")

    threads = [threading.Thread(target=fresh_connections, args=(i,)) for i in range(4)]
    threads += [threading.Thread(target=kept_alive, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        t0 = time.monotonic()
        fleet.wait_until(lambda: len(results) >= 20 and time.monotonic() - t0 > 1.5, T(20))
        # the renewal, as deploy/certbot-deploy-hook.sh does it: new files renamed over
        # the old ones, then a reload
        renewed = tmp_path / "lineage"
        renewed.mkdir()
        shutil.copy(certs / "two.pem", renewed / "fullchain.pem")
        shutil.copy(certs / "two.key", renewed / "privkey.pem")
        env = dict(os.environ, RENEWED_LINEAGE=str(renewed), FLEETGATE_TLS_DIR=str(live),
                   FLEETGATE_GROUP="no-such-group-fleetgate-test",
                   FLEETGATE_RELOAD=f"kill -HUP {gw.pid}")
        t_reload = time.monotonic()
        p = subprocess.run(["sh", str(HOOK)], capture_output=True, text=True, timeout=30, env=env)
        assert p.returncode == 0, p.stderr
        new = fleet.wait_until(lambda: peer_cert(port, ca) == der(certs / "two.pem"), T(5),
                               interval=0.1)
        assert new, "connections after the reload do not get the renewed certificate"
        t_new = time.monotonic()
        before = len(results)
        fleet.wait_until(lambda: len(results) >= before + 20 and time.monotonic() - t_new > 1.5,
                         T(20))
    finally:
        stop.set()
        for t in threads:
            t.join(T(30))
    failed = [r for r in results if not r[0]]
    assert not failed, f"{len(failed)} of {len(results)} requests failed: {failed[:5]}"
    assert sum(1 for r in results if r[2] < t_reload) >= 20
    assert sum(1 for r in results if r[2] > t_new) >= 20
    # the kept-alive connections, opened with the old certificate, served on after it
    assert sum(1 for r in results if r[1].startswith("kept") and r[2] > t_new) >= 2
    assert g.log_msgs(gw, "configuration reloaded")
    assert not g.log_msgs(gw, "configuration reload refused; the running configuration is unchanged")
