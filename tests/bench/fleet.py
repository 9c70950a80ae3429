"""A simulated phone fleet for the benchmarks, built from
tests/bench/fleet-profiles.json, and the workload classes run against it.

Phones serve qwen3.5-0.8b (every class has the RAM for it). Rates per class:
flagship-16gb measured (prefill 466.7 tokens/s for a 7k prompt; decode 40 tokens/s, as in
config/demo.json), midrange-12gb and budget-8gb scaled by their speed_factor_vs_flagship
(0.55, 0.3; budget's 0.3 x 40 = 12 tokens/s matches the measured 46 tokens/s aggregate
over 4 chats, 11.5 per slot). Slots 1-4 per phone."""

import json
import random
from pathlib import Path

import benchlib as bl

MODEL = "qwen3.5-0.8b"
N_CTX = 8192

# (class, slots) for each phone: 6 flagship, 8 midrange, 10 budget = 24 phones, 54 slots.
LAYOUT = ([("flagship-16gb", s) for s in (4, 4, 2, 2, 1, 1)]
          + [("midrange-12gb", s) for s in (3, 3, 2, 2, 2, 1, 1, 1)]
          + [("budget-8gb", s) for s in (4, 4, 4, 4, 2, 2, 2, 1, 1, 1)])

SHORT = {"flagship-16gb": "flag", "midrange-12gb": "mid", "budget-8gb": "budget"}


def class_rates(profiles_path=None):
    prof = json.loads(Path(profiles_path or bl.PROFILES).read_text())
    cls = {c["name"]: c for c in prof["phone_classes"]}
    flag = cls["flagship-16gb"]["qwen3.5-0.8b"]
    base_prefill = flag["prefill_tps_7k_prompt"]          # 466.7, measured
    base_decode = 40.0                                     # flagship 0.8b decode (demo config)
    out = {}
    for name, c in cls.items():
        f = c.get("speed_factor_vs_flagship", 1.0)
        out[name] = {"prefill_tps": round(base_prefill * f, 1), "decode_tps": round(base_decode * f, 2)}
    return out, prof


def build(n=None, layout=None):
    """The phones: list of dicts {id, class, slots, prefill_tps, decode_tps, n_ctx}."""
    rates, _ = class_rates()
    lay = layout or LAYOUT
    if n:
        lay = [lay[(i * len(lay)) // n] for i in range(n)]
    phones, counts = [], {}
    for cls, slots in lay:
        counts[cls] = counts.get(cls, 0) + 1
        phones.append({"id": f"{SHORT[cls]}-{counts[cls]:02d}", "class": cls, "slots": slots,
                       "prefill_tps": rates[cls]["prefill_tps"],
                       "decode_tps": rates[cls]["decode_tps"], "n_ctx": N_CTX})
    return phones


# ------------------------------------------------------------------------------ workload

def workload_classes():
    """From fleet-profiles.json's workloads: fraud-review (7,000-token prompt, 8 tokens out),
    scam-filter (100 tokens, 4 out), chat (500 tokens, 300 out, streamed). Share of requests:
    20 % / 50 % / 30 %."""
    _, prof = class_rates()
    w = {x["name"]: x for x in prof["workloads"]}
    return [
        {"name": "fraud", "prompt_tokens": w["fraud-review"]["prompt_tokens"],
         "max_tokens": w["fraud-review"]["max_tokens"], "stream": False, "share": 0.2},
        {"name": "scam", "prompt_tokens": w["scam-filter"]["prompt_tokens"],
         "max_tokens": w["scam-filter"]["max_tokens"], "stream": False, "share": 0.5},
        {"name": "chat", "prompt_tokens": w["chat"]["prompt_tokens"],
         "max_tokens": w["chat"]["max_tokens"], "stream": True, "share": 0.3},
    ]


def service_s(phone, wc):
    """Seconds (simulated) one slot of `phone` needs for a request of class wc."""
    return wc["prompt_tokens"] / phone["prefill_tps"] + wc["max_tokens"] / phone["decode_tps"]


def capacity(phones, classes=None, slow=None):
    """Requests per simulated second the fleet completes with every slot busy on the
    average request mix: sum over phones of slots / (mix-weighted service time).
    slow: {phone_id: factor} for phones running `factor` times slower."""
    classes = classes or workload_classes()
    total = 0.0
    for p in phones:
        f = (slow or {}).get(p["id"], 1.0)
        mean = sum(c["share"] * service_s(p, c) for c in classes) * f
        total += p["slots"] / mean
    return total


WORDS = ("account transfer payee invoice urgent verify code bank card refund customer merchant "
         "amount balance login device location limit review risk pattern history chargeback "
         "address delivery parcel wallet crypto gift support password security alert").split()


def text_of_tokens(rng, tokens):
    """About `tokens` tokens of text (the gateway and the sim count characters / 4)."""
    want = tokens * 4
    out, n = [], 0
    while n < want:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:want]


FRAUD_SYSTEM = ("You review card transactions for fraud. Read the case file: the customer's "
                "profile, recent transactions, device and login history and the flagged "
                "payment. Answer with one line: RISK_LEVEL: 1-5. ") * 8   # ~1,500 chars shared
SCAM_SYSTEM = "Classify the message: SCAM or OK."


def make_body(rng, wc, model=MODEL):
    """A request body whose chat template comes to about wc['prompt_tokens'] tokens."""
    if wc["name"] == "fraud":
        sys_ = FRAUD_SYSTEM
        user = text_of_tokens(rng, wc["prompt_tokens"] - len(sys_) // 4 - 12)
    elif wc["name"] == "scam":
        sys_ = SCAM_SYSTEM
        user = text_of_tokens(rng, wc["prompt_tokens"] - len(sys_) // 4 - 12)
    else:
        sys_ = "You are a helpful assistant."
        user = text_of_tokens(rng, wc["prompt_tokens"] - len(sys_) // 4 - 12)
    body = {"model": model, "messages": [{"role": "system", "content": sys_},
                                         {"role": "user", "content": user}],
            "max_tokens": wc["max_tokens"]}
    if wc["stream"]:
        body["stream"] = True
    return json.dumps(body).encode()


def schedule(rate, duration, seed, classes=None):
    """Open-loop arrivals: a Poisson process of `rate` requests per wall second for
    `duration` seconds; each arrival's class drawn by share. Same seed, same schedule."""
    classes = classes or workload_classes()
    rng = random.Random(seed)
    t, out = 0.0, []
    cum = []
    acc = 0.0
    for c in classes:
        acc += c["share"]
        cum.append((acc, c))
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            break
        x = rng.random() * acc
        wc = next(c for a, c in cum if x <= a)
        out.append((t, wc))
    return out


def write_device_tree(root, battery_pct=81, status="Charging", cpu_temp_c=35.0, clock_ratio=1.0,
                      cpus=8, top_khz=2000000):
    """A phone's /sys below root, as Android lays it out and agent/device.c reads it
    (--sysfs-root; tests/system/test_agent.py's fake_phone is the full one): a battery
    (capacity, status, temp), a battery and a CPU thermal zone, and `cpus` cores whose
    scaling_max_freq is clock_ratio x their cpuinfo_max_freq."""
    root = Path(root)

    def put(rel, text):
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"{text}\n")
    put("sys/class/power_supply/battery/type", "Battery")
    put("sys/class/power_supply/battery/capacity", int(battery_pct))
    put("sys/class/power_supply/battery/status", status)
    put("sys/class/power_supply/battery/temp", 310)
    for i, (kind, c) in enumerate((("battery", 31.0), ("cpuss-0", cpu_temp_c))):
        put(f"sys/class/thermal/thermal_zone{i}/type", kind)
        put(f"sys/class/thermal/thermal_zone{i}/temp", int(round(c * 1000)))
    for i in range(cpus):
        put(f"sys/devices/system/cpu/cpu{i}/cpufreq/cpuinfo_max_freq", top_khz)
        put(f"sys/devices/system/cpu/cpu{i}/cpufreq/scaling_max_freq", int(round(top_khz * clock_ratio)))
    return root


def start_fleet(procs, wd, phones, scale, fault_plans=None, cpu=None, devices=None, gateway=None,
                log_level="warn"):
    """Start one sim per phone; returns phones with 'port' and 'proc' set (a 'port' already
    in a phone's dict is kept: the gateway may have been told it first). fault_plans:
    {phone_id: [windows]}. devices: {phone_id: write_device_tree() keywords}: that phone's
    agent reads a fake /sys (--sysfs-root). gateway: a fleetgate URL the phones send
    signed heartbeats to (--gateway, --public-url; FLEETGATE_FLEET_SECRET from
    FLEET_SECRET), as phones of a real deployment do: the only way their device readings
    reach a gateway. log_level info: each sim logs one line per request (with the
    caller's x-request-id) and its fault windows' edges."""
    wd = Path(wd)
    out = []
    for p in phones:
        q = dict(p)
        q["port"] = p.get("port") or bl.free_port()
        q["agent"] = True  # fleetgate-agent: its status carries load and progress
        argv = [bl.agent_bin(), "--engine", "sim", "--listen", f"{bl.HOST}:{q['port']}",
                "--model", MODEL, "--id", p["id"], "--slots", str(p["slots"]),
                "--prefill-tps", str(p["prefill_tps"]), "--decode-tps", str(p["decode_tps"]),
                "--n-ctx", str(p["n_ctx"]), "--time-scale", str(scale), "--log-level", log_level]
        argv += [str(x) for x in p.get("sim_args", ())]  # e.g. --cache-mode hybrid
        plan = (fault_plans or {}).get(p["id"])
        if plan:
            f = wd / f"faults-{p['id']}.json"
            f.write_text(json.dumps(plan))
            argv += ["--fault-plan", str(f)]
        dev = (devices or {}).get(p["id"])
        if dev is not None:
            argv += ["--sysfs-root", str(write_device_tree(wd / f"sys-{p['id']}", **dev))]
        env = None
        if gateway:
            argv += ["--gateway", gateway, "--public-url", f"http://{bl.HOST}:{q['port']}"]
            env = {"FLEETGATE_FLEET_SECRET": FLEET_SECRET}  # the gateway names its token
        q["log"] = wd / f"sim-{p['id']}.log"
        q["proc"] = procs.spawn("sim-" + p["id"], argv, log=q["log"], cpu=cpu, env=env)
        out.append(q)
    for q in out:
        if not bl.wait_port(q["port"], timeout=10, proc=q["proc"]):
            raise RuntimeError(f"sim {q['id']} did not start")
    return out


# The bench's fleet secret for heartbeat phones (the gateway's fleet.secret_env).
FLEET_SECRET = "b2-bench-fleet-secret-0123456789abcdef"


def sim_log(path):
    """The JSON lines of a sim's log (others skipped), each with 'wall' = its ts in epoch s."""
    import datetime
    out = []
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            o = json.loads(line)
            o["wall"] = datetime.datetime.strptime(o["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
                tzinfo=datetime.timezone.utc).timestamp()
        except (ValueError, KeyError):
            continue
        out.append(o)
    return out
