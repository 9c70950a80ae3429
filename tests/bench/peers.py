"""Start each proxy under test in front of a list of replicas, with the configuration a
careful operator would write (templates in tests/bench/peers/, every choice commented
there and in docs/benchmarks.md).

A replica is a dict: {"id", "port", "slots", "prefill_tps", "decode_tps", "n_ctx"}.
`t` is a dict of timeouts in wall-clock seconds (see default_timeouts()).

Each start_* returns a Proxy: name, port (HTTP), tls_port (HTTPS or None), the Popen
handle, the rendered config file and the extra request headers the proxy needs."""

import json
import os
from pathlib import Path

import benchlib as bl

PROXIES = ("nginx", "haproxy", "portkey", "fleetgate")


class Proxy:
    def __init__(self, name, port, tls_port, proc, config, headers=None, log=None):
        self.name, self.port, self.tls_port, self.proc = name, port, tls_port, proc
        self.config, self.headers, self.log = config, headers or {}, log

    def url(self, tls=False):
        if tls:
            return f"https://{bl.HOST}:{self.tls_port}" if self.tls_port else None
        return f"http://{bl.HOST}:{self.port}"


def default_timeouts(scale=1.0):
    """Real-world operator values for a fleet of phones, divided by the simulation's time
    scale (a phone that runs K times faster needs K times shorter timeouts). Real values:
    connect 10 s; a whole answer 150 s (3x the slowest phone's 7,000-token review, 50 s);
    an idle stream 60 s; a request may wait 180 s for a slot (the clients' own budget);
    health probe every 5 s (15 s while down) with a 3 s timeout; a phone that failed
    rests 5 s (fleetgate doubles that up to 120 s; nginx's fail_timeout is 10 s)."""
    k = float(scale)
    return {
        "connect": 10 / k, "read": 150 / k, "stream_idle": 60 / k, "queue": 180 / k,
        "client": 600 / k, "check_inter": 5 / k, "down_inter": 15 / k, "check_timeout": 3 / k,
        "cooldown": 5 / k, "cooldown_max": 120 / k, "fail_timeout": 10 / k,
        "timeout_min": 30 / k, "gw_queue": 600 / k, "retries": 3,
        # fleetgate's own defaults in seconds, scaled the same way
        "hedge_min": 2 / k, "short": 2 / k, "silence_min": 5 / k,
        "busy_inter": 1 / k, "late": 1 / k,
        # the windows over which it reads how much work comes (sim.md, "Time scale")
        "short_recent": 60 / k, "load_window": 60 / k,
    }


def ms(sec):
    return f"{max(1, int(round(sec * 1000)))}ms"


def fd_maxconn():
    """Connections a proxy can hold with this process's open-files limit (2 fds each)."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lim = hard if hard != resource.RLIM_INFINITY else 1048576
    return max(1000, (lim - 200) // 2)


def _tls(wd):
    cert, key = bl.make_cert(wd)
    pem = Path(wd) / "haproxy.pem"
    if not pem.exists():
        pem.write_text(cert.read_text() + key.read_text())
    return cert, key, pem


def start_nginx(procs, wd, replicas, t, cpu=None, access_log=True, workers=1):
    wd = Path(wd)
    cert, key, _ = _tls(wd)
    port, tls_port = bl.free_port(), bl.free_port()
    servers = "\n".join(
        f"        server {bl.HOST}:{r['port']} weight={r.get('slots', 1)} max_fails=2 "
        f"fail_timeout={max(1, int(round(t['fail_timeout'])))}s;"  # whole seconds only
        for r in replicas)
    cfg = bl.render("nginx-proxy.conf", wd / "nginx.conf", dir=wd, workers=workers,
                    access_log=(f"{wd}/nginx-access.log bench" if access_log else "off"),
                    servers=servers, port=port, tls_port=tls_port, cert=cert, key=key,
                    connect_timeout=ms(t["connect"]), send_timeout=ms(t["read"]),
                    read_timeout=ms(t["read"]), tries=t["retries"] + 1,
                    next_timeout=ms(t["queue"]))
    p = procs.spawn("nginx", ["nginx", "-p", str(wd), "-e", str(wd / "nginx-error.log"),
                              "-c", str(cfg), "-g", "daemon off;"], log=wd / "nginx.out", cpu=cpu)
    wait = max(15.0, len(replicas) / 100)  # thousands of replicas (B6) take a while to load on a busy machine
    if not (bl.wait_port(port, timeout=wait, proc=p) and bl.wait_port(tls_port, timeout=wait, proc=p)):
        raise RuntimeError(f"nginx did not start: {(wd / 'nginx-error.log').read_text()[-2000:]}")
    return Proxy("nginx", port, tls_port, p, cfg, log=wd / "nginx-access.log")


def start_haproxy(procs, wd, replicas, t, cpu=None, access_log=True, threads=1):
    wd = Path(wd)
    _, _, pem = _tls(wd)
    port, tls_port = bl.free_port(), bl.free_port()
    servers = "\n".join(
        f"    server {r['id']} {bl.HOST}:{r['port']} weight {min(256, r.get('slots', 1))} "
        f"maxconn {r.get('maxconn', r.get('slots', 1))} check" for r in replicas)
    cfg = bl.render("haproxy.cfg", wd / "haproxy.cfg", threads=threads,
                    log_level=("info" if access_log else "emerg"), port=port, tls_port=tls_port,
                    pem=pem, servers=servers, connect_timeout=ms(t["connect"]),
                    client_timeout=ms(t["client"]), server_timeout=ms(t["read"]),
                    queue_timeout=ms(t["queue"]), check_timeout=ms(t["check_timeout"]),
                    check_inter=ms(t["check_inter"]), down_inter=ms(t["down_inter"]),
                    retries=t["retries"], maxconn=fd_maxconn())
    p = procs.spawn("haproxy", ["haproxy", "-db", "-f", str(cfg)], log=wd / "haproxy.log", cpu=cpu)
    wait = max(15.0, len(replicas) / 100)  # thousands of replicas (B6) take a while to load on a busy machine
    if not (bl.wait_port(port, timeout=wait, proc=p) and bl.wait_port(tls_port, timeout=wait, proc=p)):
        raise RuntimeError(f"haproxy did not start: {(wd / 'haproxy.log').read_text()[-2000:]}")
    return Proxy("haproxy", port, tls_port, p, cfg, log=wd / "haproxy.log")


def portkey_config(replicas, t, groups=None):
    """Portkey's gateway config (sent in the x-portkey-config header): a fallback chain of
    load-balance groups over every replica, weights = slots. Each group is one weighted
    random pick, so N groups = 1 attempt + N-1 retries, each on a phone picked afresh
    (Portkey's own `retry` re-tries the *same* target after a back-off of whole seconds,
    which a dead phone does not survive, so it is not used). request_timeout bounds a hung
    phone like the others' read timeouts."""
    groups = groups or (t["retries"] + 1)
    targets = [{"provider": "openai", "api_key": "unused",
                "custom_host": f"http://{bl.HOST}:{r['port']}/v1",
                "weight": r.get("slots", 1)} for r in replicas]
    return {
        "strategy": {"mode": "fallback"},
        "request_timeout": int(t["read"] * 1000),
        "targets": [{"strategy": {"mode": "loadbalance"}, "targets": targets}
                    for _ in range(groups)],
    }


def start_portkey(procs, wd, replicas, t, cpu=None, access_log=True):
    wd = Path(wd)
    entry = bl.portkey_entry()
    if entry is None:
        raise RuntimeError("Portkey gateway not installed: run `npm ci` in tests/bench/node")
    port = bl.free_port()
    conf = portkey_config(replicas, t)
    cfgp = wd / "portkey-config.json"
    cfgp.write_text(json.dumps(conf, indent=1))
    p = procs.spawn("portkey", ["node", "--require", str(bl.NODE_DIR / "bind-localhost.cjs"),
                                str(entry), f"--port={port}", "--headless"],
                    log=wd / "portkey.log", env={"NODE_ENV": "production"}, cpu=cpu)
    if not bl.wait_port(port, timeout=30, proc=p):
        raise RuntimeError(f"portkey did not start: {(wd / 'portkey.log').read_text()[-2000:]}")
    return Proxy("portkey", port, None, p, cfgp,
                 headers={"x-portkey-config": json.dumps(conf, separators=(",", ":"))},
                 log=wd / "portkey.log")


def fleetgate_replicas(replicas, model, scale=1.0):
    out = []
    for r in replicas:
        e = {"id": r["id"], "url": f"http://{bl.HOST}:{r['port']}", "models": [model],
             "slots": min(64, r.get("slots", 1))}
        # sim.md: a time-scaled sim reports rates K times the configured ones; seed with them.
        if "prefill_tps" in r:
            e["prefill_tps"] = r["prefill_tps"] * scale
            e["decode_tps"] = r["decode_tps"] * scale
        if r.get("n_ctx"):
            e["n_ctx"] = r["n_ctx"]
        if r.get("agent"):
            e["agent"] = True  # probed at /agent/v1/status, as an operator marks agents
        if r.get("heartbeats"):
            e["heartbeats"] = True  # its phone's signed heartbeats (and device readings) taken
        out.append(e)
    return out


def merge_config(base, extra):
    """base with extra's keys put in (objects merged key by key, anything else replaced)."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge_config(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def start_fleetgate(procs, wd, replicas, t, model, scale=1.0, cpu=None, access_log=True,
                    health=True, extra=None, env=None):
    """extra: more configuration merged into the rendered peers/fleetgate.json (B5 adds
    `data_dir` and `batch`, B2's device cell `fleet` and `admin`). env: more environment
    (B2's device cell: the fleet secret)."""
    wd = Path(wd)
    cert, key = bl.make_cert(wd)
    port, tls_port = bl.free_port(), bl.free_port()
    reps = fleetgate_replicas(replicas, model, scale)
    cfg = bl.render("fleetgate.json", wd / "fleetgate.json", port=port, tls_port=tls_port,
                    cert=cert, key=key, send_timeout=max(0.1, round(t["client"], 3)),
                    queue_timeout=round(t["gw_queue"], 3), retries=t["retries"],
                    connect_timeout=max(0.1, round(t["connect"], 3)),
                    timeout_min=max(0.1, round(t["timeout_min"], 3)),
                    stream_idle=max(0.1, round(t["stream_idle"], 3)),
                    hedge_min=round(t.get("hedge_min", 2), 3), short_s=round(t.get("short", 2), 3),
                    short_recent=round(t.get("short_recent", 60), 3),
                    load_window=max(0.1, round(t.get("load_window", 60), 3)),
                    silence_min=round(t.get("silence_min", 5), 3),
                    check_inter=(max(0.05, round(t["check_inter"], 3)) if health else 0),
                    check_timeout=max(0.05, round(t["check_timeout"], 3)),
                    busy_inter=(max(0.01, round(t.get("busy_inter", 1), 3)) if health else 0),
                    late=round(t.get("late", 1), 3),
                    cooldown=max(0.01, round(t["cooldown"], 3)),
                    cooldown_max=max(0.01, round(t["cooldown_max"], 3)),
                    log_level=(os.environ.get("FLEETGATE_BENCH_LOG_LEVEL") or ("info" if access_log else "warn")),
                    replicas=json.dumps(reps, indent=1))
    # FLEETGATE_BENCH_FLEETGATE_SET: a JSON object merged into fleetgate's configuration
    # last (a settings sweep: '{"scheduler": {"short_reserve": 2}}')
    more = os.environ.get("FLEETGATE_BENCH_FLEETGATE_SET")
    if more:
        extra = merge_config(extra or {}, json.loads(more))
    if extra:
        cfg.write_text(json.dumps(merge_config(json.loads(cfg.read_text()), extra), indent=1))
    p = procs.spawn("fleetgate", [bl.gateway_bin(), "--config", str(cfg)],
                    log=wd / "fleetgate.log", cpu=cpu, env=env)
    wait = max(15.0, len(replicas) / 100)  # thousands of replicas (B6) take a while to load on a busy machine
    if not (bl.wait_port(port, timeout=wait, proc=p) and bl.wait_port(tls_port, timeout=wait, proc=p)):
        raise RuntimeError(f"fleetgate did not start: {(wd / 'fleetgate.log').read_text()[-2000:]}")
    return Proxy("fleetgate", port, tls_port, p, cfg, log=wd / "fleetgate.log")


def start(name, procs, wd, replicas, t, model, scale=1.0, cpu=None, access_log=True, **fleetgate_kw):
    """fleetgate_kw: start_fleetgate's extra and env (other proxies take none)."""
    sub = Path(wd) / name
    sub.mkdir(parents=True, exist_ok=True)
    if name == "nginx":
        return start_nginx(procs, sub, replicas, t, cpu=cpu, access_log=access_log)
    if name == "haproxy":
        return start_haproxy(procs, sub, replicas, t, cpu=cpu, access_log=access_log)
    if name == "portkey":
        return start_portkey(procs, sub, replicas, t, cpu=cpu, access_log=access_log)
    if name == "fleetgate":
        return start_fleetgate(procs, sub, replicas, t, model, scale=scale, cpu=cpu,
                               access_log=access_log, **fleetgate_kw)
    raise ValueError(name)


def available(names):
    out = []
    for n in names:
        if n in ("nginx", "haproxy") and not bl.have(n):
            print(f"# {n} not installed: skipped")
            continue
        if n == "portkey" and bl.portkey_entry() is None:
            print("# portkey not installed (npm ci in tests/bench/node): skipped")
            continue
        out.append(n)
    return out
