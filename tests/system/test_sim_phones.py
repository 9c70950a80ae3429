"""Many simulated phones in one agent process (docs/sim.md "Many phones in one process"):
`fleetgate-agent --engine sim --phones-file FILE` or `--phones N`, each phone a whole sim
on a port of its own. The gateway in front of one agent hosting 50 phones spreads
requests over them; one phone's fault plan affects it alone; each phone answers with its
own id, slots, rates and token; several hosted phones heartbeat a gateway, each with its
own key; a hosted phone times its answers as a phone alone in its process does."""

import concurrent.futures
import hashlib
import hmac
import json
import os
import subprocess
import time
from pathlib import Path

import requests

import fleet
from fleet import HOST, T, wait_until

MODEL = "sim-model"
CHAT = "/v1/chat/completions"
BASE_TOKEN = "hosted-phones-token-0123456789"
SECRET = "fleet-secret-0123456789abcdef"
SCALE = 20


def phone_token(base, pid):
    """A hosted phone's token: hex HMAC-SHA256 of its id under the base token."""
    return hmac.new(base.encode(), pid.encode(), hashlib.sha256).hexdigest()


def start_host(procs, tmp_path, phones=None, count=None, env=None, extra=(), name="phones"):
    """One agent hosting phones (a list of phones-file entries, or count copies); returns
    (daemon, {id: port}) once it has written its ports file."""
    ports_file = tmp_path / f"{name}-ports.json"
    argv = [fleet.agent_bin(), "--engine", "sim", "--listen", f"{HOST}:0", "--model", MODEL,
            "--slots", "1", "--prefill-tps", "2000", "--decode-tps", "100", "--time-scale", str(SCALE),
            "--ports-file", str(ports_file)]
    if phones is not None:
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps(phones))
        argv += ["--phones-file", str(f)]
    else:
        argv += ["--phones", str(count)]
    d = procs.spawn(name, lambda ports: argv + list(extra), n_ports=0, env=env,
                    ready=lambda d: ports_file.exists())
    return d, {e["id"]: e["port"] for e in json.loads(ports_file.read_text())}


def gw_config(port, replicas, **over):
    cfg = {
        "listen": [{"address": f"{HOST}:{port}"}],
        "upstream": dict(fleet.ALLOW_LOOPBACK, connect_timeout_s=2, timeout_min_s=5),
        "health": {"interval_s": 0.5, "timeout_s": 1, "rise": 1, "fall": 1, "readyz_counts": True},
        "queue": {"max": 1000, "timeout_s": 60},
        "scheduler": {"retries": 3, "default_max_tokens": 16},
        "log_level": "info",
        "replicas": replicas,
    }
    cfg.update(over)
    return cfg


def run_agent(args, env=None):
    """The agent run to its exit (a refused setting), its output captured."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("FLEETGATE_")}
    e.update(env or {})
    return subprocess.run([fleet.agent_bin(), "--engine", "sim", "--listen", f"{HOST}:0", "--model", MODEL,
                           *args], env=e, capture_output=True, text=True, timeout=T(10))


def readyz(g):
    try:
        return requests.get(g.url + "/readyz", timeout=1).json().get("replicas_ready") or 0
    except (requests.RequestException, ValueError):
        return 0


def chat(url, content, max_tokens=4, headers=None, timeout=None):
    return requests.post(url + CHAT, json=fleet.chat_body(content, model=MODEL, max_tokens=max_tokens),
                         headers=headers or {}, timeout=timeout or T(30))


def test_gateway_spreads_requests_over_fifty_phones_of_one_agent(procs, gateway, tmp_path):
    """50 phones in one agent, each with its own token: p-7 answers 503 to everything and
    p-8 is offline (their fault plans); p-9 runs 4x slower. The gateway in front of the 50
    counts 48 ready, answers 150 requests with none failed and none on p-7 or p-8, spread
    over at least 40 phones, each answer from the phone its header names. Directly: p-6
    answers its health check while p-7 answers 503 and p-8 refuses connections; a phone's
    token opens it and no other, the base token none; each phone's status is its own."""
    n = 50
    forever = {"at_s": 0, "dur_s": 1e6}
    phones = [{"id": f"p-{i}", "slots": 1 + i % 3, "decode_tps": 100 + i} for i in range(1, n + 1)]
    phones[6]["fault_plan"] = [dict(forever, kind="error503")]
    phones[7]["fault_plan"] = [dict(forever, kind="offline")]
    phones[8]["fault_plan"] = [dict(forever, kind="slow", factor=4)]
    phones[8]["decode_tps"] = phones[9]["decode_tps"] = 5  # long enough to time on a busy machine
    d, ports = start_host(procs, tmp_path, phones, env={"FLEETGATE_REPLICA_TOKEN": BASE_TOKEN})
    assert sorted(ports) == sorted(p["id"] for p in phones) and len(set(ports.values())) == n
    env, reps = {}, []
    for p in phones:
        var = "TOK_" + p["id"].replace("-", "_").upper()
        env[var] = phone_token(BASE_TOKEN, p["id"])
        reps.append({"id": p["id"], "url": f"http://{HOST}:{ports[p['id']]}", "models": [MODEL],
                     "slots": p["slots"], "agent": True, "token_env": var})
    g = gateway(lambda gp: gw_config(gp[0], reps), env=env)
    assert wait_until(lambda: readyz(g) == n - 2, T(15)), (readyz(g), g.logs())
    time.sleep(1.0)  # a few more health rounds: p-7 and p-8 stay out
    assert readyz(g) == n - 2

    with concurrent.futures.ThreadPoolExecutor(40) as ex:
        rs = list(ex.map(lambda i: chat(g.url, f"request {i}", max_tokens=4), range(150)))
    served = {}
    for r in rs:
        assert r.status_code == 200, (r.status_code, r.text[:300])
        rep = r.headers["x-fleetgate-replica"]
        assert r.json()["system_fingerprint"] == rep  # answered by the phone the header names
        assert r.json()["usage"]["completion_tokens"] == 4
        served[rep] = served.get(rep, 0) + 1
    assert "p-7" not in served and "p-8" not in served, served
    assert len(served) >= 40, served

    def health(pid):
        try:
            return requests.get(f"http://{HOST}:{ports[pid]}/health", timeout=T(2)).status_code
        except requests.ConnectionError:
            return "refused"
    assert health("p-6") == 200 and health("p-9") == 200
    assert health("p-7") == 503
    assert health("p-8") == "refused"

    def status(pid, token):
        return requests.get(f"http://{HOST}:{ports[pid]}/agent/v1/status",
                            headers={"Authorization": f"Bearer {token}"}, timeout=T(2))
    for pid in ("p-1", "p-2", "p-30"):
        r = status(pid, phone_token(BASE_TOKEN, pid))
        assert r.status_code == 200, r.text
        s = r.json()
        i = int(pid.split("-")[1])
        assert s["id"] == pid and s["slots"] == 1 + i % 3, s
        assert s["decode_tps"] == phones[i - 1]["decode_tps"] * SCALE and s["prefill_tps"] == 2000 * SCALE, s
    assert status("p-2", phone_token(BASE_TOKEN, "p-1")).status_code == 401  # p-1's token opens p-1 only
    assert status("p-1", BASE_TOKEN).status_code == 401
    r = requests.post(f"http://{HOST}:{ports['p-3']}{CHAT}", json=fleet.chat_body("direct", model=MODEL),
                      timeout=T(5))
    assert r.status_code == 401  # no token

    # the slow phone's own answers, straight to it: 4x its neighbour's decode time
    def decode_ms(pid):
        r = requests.post(f"http://{HOST}:{ports[pid]}{CHAT}", timeout=T(30),
                          headers={"Authorization": f"Bearer {phone_token(BASE_TOKEN, pid)}"},
                          json=fleet.chat_body("timing", model=MODEL, max_tokens=20))
        assert r.status_code == 200, r.text
        return r.json()["timings"]["predicted_ms"]
    slow, plain = decode_ms("p-9"), decode_ms("p-10")
    # both decode 5 tokens/s x 20: 20 tokens take 0.2 s, 4x that on p-9
    assert 3.2 < slow / plain < 5.0, (slow, plain)


def test_a_hosted_phone_times_its_answers_as_a_phone_alone(procs, sim, tmp_path):
    """The same request to a phone hosted beside 19 others and to a sim alone in its
    process, with the same settings: the same token counts, and timings within 25 % (a
    400-token prompt at 4,000 tokens/s, 30 tokens at 200/s: 100 and 150 ms)."""
    d, ports = start_host(procs, tmp_path, count=20, extra=("--id", "h", "--prefill-tps", "200", "--decode-tps", "10"))
    alone = sim(model=MODEL, slots=1, prefill_tps=200, decode_tps=10, time_scale=SCALE, id="alone")
    body = fleet.chat_body(fleet.make_prompt(400, "same"), model=MODEL, max_tokens=30)
    a = requests.post(f"http://{HOST}:{ports['h-13']}{CHAT}", json=body, timeout=T(30)).json()
    b = requests.post(alone.url + CHAT, json=body, timeout=T(30)).json()
    assert a["system_fingerprint"] == "h-13" and b["system_fingerprint"] == "alone"
    assert a["usage"] == b["usage"], (a["usage"], b["usage"])
    ta, tb = a["timings"], b["timings"]
    assert ta["prompt_n"] == tb["prompt_n"] and ta["predicted_n"] == tb["predicted_n"] == 30
    for k in ("prompt_ms", "predicted_ms"):
        assert abs(ta[k] - tb[k]) <= 0.25 * tb[k] + 10, (k, ta[k], tb[k])
    # the phones' logs name the phone
    log = Path(d.stderr_path).read_text()
    lines = [json.loads(x) for x in log.splitlines() if x.startswith("{")]
    assert sum(1 for x in lines if x.get("msg") == "listening") == 20
    req = [x for x in lines if x.get("msg") == "request"]
    assert req and req[-1]["phone"] == "h-13", req


def test_hosted_phones_heartbeat_each_with_its_own_key(procs, gateway, tmp_path):
    """Five hosted phones with --gateway and --public-url http://127.0.0.1:{port}: each
    enrols its own key with the fleet secret and joins without a replica file, under its
    own id and URL; requests through the gateway reach several of them; a phones file with
    a repeated id is refused at start, naming the phones."""
    g = gateway(lambda gp: gw_config(gp[0], [], fleet={
        "secret_env": "FLEETGATE_FLEET_SECRET", "heartbeat_timeout_s": 5, "heartbeat_interval_s": 0.2}),
        env={"FLEETGATE_FLEET_SECRET": SECRET})
    d, ports = start_host(procs, tmp_path, count=5, env={"FLEETGATE_FLEET_SECRET": SECRET},
                          extra=("--id", "hb", "--slots", "2", "--gateway", g.url,
                                 "--public-url", f"http://{HOST}:{{port}}"))
    assert wait_until(lambda: readyz(g) == 5, T(15)), g.logs()
    log = Path(d.stderr_path).read_text()
    keys = {json.loads(x)["id"]: json.loads(x)["key"] for x in log.splitlines()
            if x.startswith("{") and json.loads(x).get("msg") == "listening"}
    assert sorted(keys) == [f"hb-{i}" for i in range(1, 6)] and len(set(keys.values())) == 5, keys
    with concurrent.futures.ThreadPoolExecutor(10) as ex:
        rs = list(ex.map(lambda i: chat(g.url, f"hb {i}", max_tokens=20), range(20)))
    served = {r.headers.get("x-fleetgate-replica") for r in rs if r.status_code == 200}
    assert all(r.status_code == 200 for r in rs), [r.text[:200] for r in rs if r.status_code != 200]
    assert served <= set(keys) and len(served) >= 3, served
    glog = Path(g.stderr_path).read_text()
    for pid, port in ports.items():
        assert f"http://{HOST}:{port}" in glog  # registered at its own URL

    bad = tmp_path / "dup.json"
    bad.write_text(json.dumps([{"id": "x"}, {"id": "y"}, {"id": "x"}]))
    r = run_agent(["--phones-file", str(bad)])
    assert r.returncode == 1 and "phone 3 has the id 'x' of phone 1" in r.stderr, r
    r = run_agent(["--phones", "3", "--gateway", g.url, "--public-url", "http://127.0.0.1:9"],
                  env={"FLEETGATE_FLEET_SECRET": SECRET})
    assert r.returncode == 1 and "{port}" in r.stderr, r
    r = run_agent(["--phones", "3", "--phones-file", str(bad)])
    assert r.returncode == 1 and "exclude each other" in r.stderr, r
