"""The phone build for aarch64 (deploy/build-agent-phone.sh --arch arm64), run under
qemu-user as `--engine sim` behind the real x86-64 gateway: it is a static aarch64
executable, its signed heartbeats register it, and plain and streamed chats go through it.
The binary comes from FLEETGATE_AGENT_ARM64_BIN or build-phone-arm64/; without it or
qemu-aarch64-static the test is skipped, except under CI=true, where it fails."""

import os
import subprocess
from pathlib import Path

import pytest
import requests

import fleet
import gwutil
from fleet import HOST, T

TOKEN = "arm64-s3cret-token"
SECRET = "fleet-secret-arm64-0123456789"
CHAT = "/v1/chat/completions"
ENV = {"FLEETGATE_FLEET_SECRET": SECRET, "FLEETGATE_REPLICA_TOKEN": TOKEN}
BUILD = "deploy/build-agent-phone.sh --arch arm64"


def arm64_bin():
    return os.environ.get("FLEETGATE_AGENT_ARM64_BIN") or str(
        fleet.SOURCE_ROOT / "build-phone-arm64/agent/fleetgate-agent")


@pytest.fixture
def arm64_agent():
    """(qemu, binary): both present, or the test is skipped (failed under CI=true)."""
    qemu = fleet.need_tool("qemu-aarch64-static", "deploy/setup.sh --test installs qemu-user-static")
    path = arm64_bin()
    fleet.need_tool("the arm64 agent", f"{BUILD} builds {path}",
                    found=path if os.access(path, os.X_OK) else None)
    return qemu, path


def gw_config(port):
    return {
        "listen": [{"address": f"{HOST}:{port}"}],
        "fleet": {"secret_env": "FLEETGATE_FLEET_SECRET", "replica_token_env": "FLEETGATE_REPLICA_TOKEN",
                  "heartbeat_timeout_s": 10, "heartbeat_interval_s": 0.5},
        "health": {"interval_s": 0.5, "timeout_s": 2, "rise": 1, "fall": 3, "readyz_counts": True},
        "upstream": dict(fleet.ALLOW_LOOPBACK),
        "queue": {"max": 10, "timeout_s": 30},
        "scheduler": {"retries": 1, "default_max_tokens": 64},
        "log_level": "info",
        "replicas": [],
    }


def readyz(g):
    try:
        return requests.get(g.url + "/readyz", timeout=1).json().get("replicas_ready") or 0
    except (requests.RequestException, ValueError):
        return 0


@pytest.mark.once
def test_arm64_binary_is_a_static_aarch64_executable(arm64_agent):
    fleet.need_tool("file", "apt-get install file")
    _, path = arm64_agent
    desc = subprocess.run(["file", "-b", path], capture_output=True, text=True, check=True).stdout
    assert desc.startswith("ELF 64-bit LSB executable, ARM aarch64"), desc
    assert "statically linked" in desc, desc
    print(f"{path}: {Path(path).stat().st_size} bytes: {desc.strip()}")


def test_arm64_agent_under_qemu_joins_the_gateway_and_serves(procs, gateway, arm64_agent):
    qemu, path = arm64_agent
    g = gateway(lambda ports: gw_config(ports[0]), env=ENV)

    # The gateway by name: a static glibc resolves it without NSS modules (/etc/hosts)
    gw_by_name = f"http://localhost:{g.port}"

    def argv(ports):
        a = fleet.sim_argv(ports[0], slots=2, prefill_tps=500, decode_tps=50, time_scale=10,
                           id="phone-arm64", extra_args=("--gateway", gw_by_name, "--public-url",
                                                         f"http://{HOST}:{ports[0]}"))
        return [qemu, path, *a[1:]]

    # valgrind cannot follow a qemu-emulated program: this one always runs plainly
    phone = procs.spawn("phone-arm64", argv, env=ENV, ready_timeout=20, valgrind=False)
    assert phone.argv[:2] == [qemu, path]
    assert fleet.wait_until(lambda: readyz(g) >= 1, T(20)), g.logs()
    reg = gwutil.log_msgs(g, "replica registered by heartbeat", replica="phone-arm64")
    assert len(reg) == 1 and reg[0]["url"] == phone.url, gwutil.log_records(g)[-10:]
    # (the agent logs the gateway's answer a moment after the gateway registered it)
    assert fleet.wait_until(lambda: "heartbeat accepted by" in Path(phone.stderr_path).read_text(),
                            T(10)), phone.logs()

    r = requests.post(g.url + CHAT, json=fleet.chat_body("through an arm64 phone", max_tokens=5),
                      timeout=T(20))
    assert r.status_code == 200, r.text
    assert r.headers.get("x-fleetgate-replica") == "phone-arm64", r.headers
    body = r.json()
    assert body["usage"]["completion_tokens"] == 5, body
    assert body["choices"][0]["message"]["content"], body

    r = requests.post(g.url + CHAT, json=fleet.chat_body("streamed from arm64", max_tokens=6, stream=True),
                      stream=True, timeout=T(20))
    assert r.status_code == 200 and r.headers.get("x-fleetgate-replica") == "phone-arm64", r.headers
    s = fleet.read_sse(r, timeout=T(20))
    assert s.done, s.data[-3:]
    text = "".join((c["choices"][0]["delta"].get("content") or "") for c in s.chunks() if c.get("choices"))
    assert text.strip(), s.data[-5:]
    # the phone stayed up throughout (the fixture also fails the test on an unclean exit)
    assert phone.alive()
