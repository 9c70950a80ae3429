"""deploy/demo.sh as a newcomer runs it: `--serve` brings up three simulated phones, the
gateway and its admin listener, prints the status page's URL and the admin token it
made, and the page and the admin API answer there (on ports picked free, with the
demo's generated files in the test's folder)."""
import os
import re
import signal
import subprocess
import threading
import time

import pytest
import requests

import fleet
from fleet import HOST, T

pytestmark = pytest.mark.once  # demo.sh runs the normal build: see conftest.py

DEMO = fleet.SOURCE_ROOT / "deploy/demo.sh"


def test_demo_serves_the_status_page(tmp_path):
    fleet.need_tool("curl", "apt-get install curl (deploy/setup.sh installs it)")
    fleet.need_tool("openssl", "apt-get install openssl (deploy/setup.sh installs it)")
    ports = []
    while len(ports) < 6:
        p = fleet.free_port()
        if p not in ports:
            ports.append(p)
    env = {k: v for k, v in os.environ.items()
           if k not in ("FLEETGATE_REPLICA_TOKEN", "FLEETGATE_FLEET_SECRET", "FLEETGATE_ADMIN_TOKEN")}
    env.update(FLEETGATE_DEMO_NO_SETUP="1", FLEETGATE_DEMO_DIR=str(tmp_path / "demo"),
               FLEETGATE_DEMO_PORTS=" ".join(map(str, ports)),
               FLEETGATE_BIN=fleet.gateway_bin(), FLEETGATE_AGENT_BIN=fleet.agent_bin())
    proc = subprocess.Popen(["bash", str(DEMO), "--serve"], cwd=fleet.SOURCE_ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines = []
    serving = threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("demo: serving until Ctrl-C"):
                serving.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert serving.wait(T(60)), "the demo did not get to serving:\n" + "".join(lines)
        out = "".join(lines)
        m = re.search(r"status page: (http://127\.0\.0\.1:(\d+)/)\s+\(admin token: ([0-9a-f]{32,})", out)
        assert m, out
        url, port, token = m.group(1), int(m.group(2)), m.group(3)
        assert port == ports[2]
        assert (tmp_path / "demo/demo-admin-token").read_text().strip() == token
        assert (tmp_path / "demo/demo-admin-token").stat().st_mode & 0o077 == 0

        page = requests.get(url, timeout=T(5))
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert "fleetgate" in page.text.lower()
        admin = url.rstrip("/")
        assert requests.get(admin + "/admin/v1/replicas", timeout=T(5)).status_code == 401
        r = requests.get(admin + "/admin/v1/replicas", timeout=T(5),
                         headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200, r.text
        reps = r.json()["replicas"]
        assert sorted(x["id"] for x in reps) == ["budget-01", "flagship-01", "midrange-01"]
        # the page's live stream answers with the token too
        with requests.get(admin + "/admin/v1/status", stream=True, timeout=T(5),
                          headers={"Authorization": f"Bearer {token}",
                                   "Accept": "text/event-stream"}) as s:
            assert s.status_code == 200
            first = next(l for l in s.iter_lines(decode_unicode=True) if l.startswith("event:"))
            assert first == "event: hello", first
        # and the demo's chat answered before it said it was serving
        assert "x-fleetgate-replica:" in out.lower()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=T(20))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        reader.join(5)
    # everything it started is gone: the ports are free again
    time.sleep(0.2)
    assert not [p for p in ports if fleet.port_accepts(p)], "".join(lines)
    # and it said so once
    stopped = [l for l in lines if l.startswith("demo: stopped")]
    assert len(stopped) == 1, "".join(lines)
