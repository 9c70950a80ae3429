"""Device-aware routing (issue 20, part 5): heartbeat phones read a fake /sys
(--sysfs-root) and the gateway routes by what they say. A phone at 8 % battery and not
charging takes no new work while an identical one does, and takes work again once it
charges; at 15 % it takes one request at a time; a hot, clock-capped phone is planned
slower than an identical cool one. The admin API, its events and /metrics say why."""
import concurrent.futures
import json

import requests

import fleet
from fleet import HOST, T
from test_agent import GW_ENV, SECRET, TOKEN, fake_phone, gw_config

CHAT = "/v1/chat/completions"
ADMIN_TOKEN = "admin-token-0123456789"
AH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
# fake_phone's second CPU zone is always 55 °C: 60 makes a phone cool unless its first
# CPU zone (cpu_temp) is hotter
DEVICE = {"hot_c": 60}


def cool(root, **kw):
    fake_phone(root, **dict(dict(capacity="81", status="Charging", cpu_temp="50000", big_cap="2841600"), **kw))


def start(procs, gateway, tmp_path, phones, slots=1, log_level="info", device=DEVICE):
    """A gateway with an admin listener and heartbeat sim phones, one per (id, tree maker)."""
    def cfg(ports):
        c = gw_config(ports[0])
        c["admin"] = {"listen": f"{HOST}:{ports[1]}", "token": ADMIN_TOKEN}
        c["scheduler"]["device"] = device
        c["log_level"] = log_level
        return c
    g = gateway(cfg, n_ports=2, env=GW_ENV)
    g.admin = f"http://{HOST}:{g.ports[1]}"
    roots = {}
    for pid, make in phones:
        root = tmp_path / pid
        make(root)
        roots[pid] = root
        procs.spawn(pid, lambda ports, pid=pid, root=root: fleet.sim_argv(
            ports[0], slots=slots, prefill_tps=2000, decode_tps=40, time_scale=1, id=pid,
            extra_args=("--gateway", g.url, "--public-url", f"http://{HOST}:{ports[0]}",
                        "--sysfs-root", str(root))),
            env={"FLEETGATE_FLEET_SECRET": SECRET, "FLEETGATE_REPLICA_TOKEN": TOKEN})
    # (a phone held back under the floor takes no work: /readyz does not count it)
    def joined():
        try:
            have = reps(g)
        except requests.RequestException:
            return False
        return all(pid in have and have[pid]["battery_pct"] is not None for pid, _ in phones)
    assert fleet.wait_until(joined, T(15)), g.logs()
    return g, roots


def reps(g):
    r = requests.get(g.admin + "/admin/v1/replicas", headers=AH, timeout=T(5))
    assert r.status_code == 200, r.text
    return {x["id"]: x for x in r.json()["replicas"]}


def events(g):
    r = requests.get(g.admin + "/admin/v1/events", headers=AH, timeout=T(5))
    assert r.status_code == 200, r.text
    return r.json()["events"]


def burst(g, n, max_tokens=20):
    """n requests at once; the replica that answered each."""
    def one(i):
        r = requests.post(g.url + CHAT, json=fleet.chat_body(f"request {i}", max_tokens=max_tokens),
                          timeout=T(60))
        assert r.status_code == 200, r.text
        return r.headers["x-fleetgate-replica"]
    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        return list(ex.map(one, range(n)))


def test_a_phone_low_on_battery_and_not_charging_takes_no_new_work_until_it_charges(procs, gateway, tmp_path):
    g, roots = start(procs, gateway, tmp_path, [
        ("phone-low", lambda root: cool(root, capacity="8", status="Discharging")),
        ("phone-ok", cool)])
    def held():
        return reps(g)["phone-low"]["held_back"]
    assert fleet.wait_until(lambda: held() is not None, T(10)), reps(g)
    low, ok = reps(g)["phone-low"], reps(g)["phone-ok"]
    assert "battery 8 % and not charging" in low["held_back"] and "floor of 10 %" in low["held_back"], low
    assert low["device_slots"] == 0 and low["state"] == "ready" and not low["draining"], low
    assert ok["held_back"] is None and ok["device_slots"] is None and ok["device_slowdown"] == 1, ok
    # every request goes to the other phone, though both are free at first
    assert burst(g, 4) == ["phone-ok"] * 4
    ev = [e for e in events(g) if e["type"].startswith("replica_held_back")]
    assert [(e["type"], e["replica"]) for e in ev] == [("replica_held_back", "phone-low")], ev
    assert "floor of 10 %" in ev[0]["held_back"] and "phone-low is held back" in ev[0]["message"], ev

    # plugged in: the hold lifts by itself, and the phone takes work again
    cool(roots["phone-low"], capacity="8", status="Charging")
    assert fleet.wait_until(lambda: held() is None, T(15)), reps(g)
    assert reps(g)["phone-low"]["device_slots"] is None
    got = burst(g, 6)
    assert "phone-low" in got and "phone-ok" in got, got
    ev = [e for e in events(g) if e["type"].startswith("replica_held_back")]
    assert ev[-1]["type"] == "replica_held_back_ended" and ev[-1]["held_back"] is None, ev

    # unplugged at 15 %: one request at a time (its 1-slot sim would not show it: the
    # limit is what the admin API says)
    cool(roots["phone-low"], capacity="15", status="Discharging")
    assert fleet.wait_until(lambda: (held() or "").find("one request at a time") >= 0, T(15)), reps(g)
    assert reps(g)["phone-low"]["device_slots"] == 1
    assert '"msg":"replica held back"' in open(g.stderr_path).read()


def test_a_hot_phone_is_planned_slower_than_an_identical_cool_one(procs, gateway, tmp_path):
    # 70 °C and the big cores capped to half: 3x slower (hot_slowdown beats 1 / 0.69)
    g, roots = start(procs, gateway, tmp_path, [
        ("phone-hot", lambda root: cool(root, cpu_temp="70000", big_cap="1420800")),
        ("phone-cool", cool)], log_level="debug",
        # the sims are in truth equally fast: answers would soon teach that (the slowdown
        # fades over hot_answers), so this test keeps the heat for longer
        device=dict(DEVICE, hot_answers=50, hot_slowdown=3))
    assert fleet.wait_until(lambda: reps(g)["phone-hot"]["held_back"] is not None, T(10)), reps(g)
    hot, cold = reps(g)["phone-hot"], reps(g)["phone-cool"]
    assert "70.0 °C, over 60 °C" in hot["held_back"] and "CPU clock capped to 69 %" in hot["held_back"], hot
    assert "planned 3× slower" in hot["held_back"], hot
    assert hot["device_slowdown"] == 3 and hot["device_slots"] is None, hot
    assert cold["held_back"] is None and cold["device_slowdown"] == 1, cold
    # one at a time, both free: the cool phone finishes sooner, every time
    for i in range(3):
        r = requests.post(g.url + CHAT, json=fleet.chat_body(f"request {i}", max_tokens=40), timeout=T(30))
        assert r.status_code == 200 and r.headers["x-fleetgate-replica"] == "phone-cool", (r.status_code, r.headers)
    # under load the hot phone helps, but takes fewer requests
    got = burst(g, 8, max_tokens=40)
    assert "phone-hot" in got and got.count("phone-hot") < got.count("phone-cool"), got
    # its answers measured while hot begin to take the slowdown's place
    assert 1 < reps(g)["phone-hot"]["device_slowdown"] < 3, reps(g)["phone-hot"]
    # and the plan predicted it slower: dispatch lines of the same request size
    pred = {"phone-hot": [], "phone-cool": []}
    for line in open(g.stderr_path):
        if '"decision":"dispatch"' in line:
            d = json.loads(line)
            pred[d["replica"]].append(d["predicted_finish_s"])
    assert pred["phone-hot"], pred
    # the same size of request: about 3x apart (the first to the hot phone, before any fade)
    assert min(pred["phone-hot"]) > min(pred["phone-cool"]) * 2, pred
    # cooled down: no longer held back, planned as its learned rates say
    cool(roots["phone-hot"])
    assert fleet.wait_until(lambda: reps(g)["phone-hot"]["held_back"] is None, T(15)), reps(g)
    assert reps(g)["phone-hot"]["device_slowdown"] == 1
