"""What operators see must be true (issue 19, part 7): a stream that ended in an error is
counted as failed with the tokens its client got, failure and state reasons say what
happened, phones joining by heartbeat or leaving the registry show in the events, and
the status page opens in a browser through a session cookie after one login.

The gateway listens on two free ports: the client API (ports[0]) and admin (ports[1])."""

import json
import time

import pytest
import requests

import fleet
import gwutil as g
from fleet import T, wait_until
from test_admin import AUTH, TOKEN, start
from test_browser import _browser_installed, browser, console_errors, fresh, text  # noqa: F401

try:
    from selenium.webdriver.common.by import By
except ImportError:  # the browser test skips, saying why
    By = None

CSRF = {"X-Fleetgate-CSRF": "1"}

DROP_ALWAYS = [{"at_s": 0, "kind": "drop", "dur_s": 100000}]


def cut_stream(gw):
    body = fleet.chat_body("tell me a long story", model=g.MODEL, max_tokens=40, stream=True)
    r = requests.post(gw.url + "/v1/chat/completions", json=body, stream=True, timeout=T(60))
    assert r.status_code == 200, r.text
    res = fleet.read_sse(r, timeout=T(60))
    assert not res.timed_out and not res.done
    chunks = res.chunks()
    assert chunks[-1]["error"]["code"] == "upstream_stream_error", chunks[-1]
    got = sum(1 for c in chunks if c.get("choices") and c["choices"][0]["delta"].get("content"))
    assert got >= 1, chunks
    return r.headers["x-request-id"], got


def test_a_stream_ended_by_an_error_counts_as_failed_with_its_tokens(sim, gateway):
    dropper = g.phone(sim, "dropper", slots=1, decode_tps=20, fault_plan=DROP_ALWAYS)
    gw, admin = start(gateway, [g.replica(dropper)], health={"interval_s": 0})
    rid, got = cut_stream(gw)
    rec = g.access_log(gw, rid)
    # the status line said 200; the outcome says the answer failed, with what was sent
    assert rec["status"] == 200 and rec["outcome"] == "stream_error", rec
    assert rec["tokens_out"] == got, (rec, got)
    assert rec["tokens_in"] > 0, rec
    m = admin.metrics()
    series = {k: v for k, v in m.items() if k.startswith("fleetgate_requests_total{")}
    assert any('status="stream_error"' in k and v == 1 for k, v in series.items()), series
    assert not any('status="200"' in k for k in series), series
    assert m[f'fleetgate_tokens_out_total{{model="{g.MODEL}"}}'] == got, m
    summary = admin.get("/admin/v1/replicas").json()["summary"]
    assert summary["error_rate"] == 1, summary
    # nor is it a request served in the costs
    costs = admin.get("/admin/v1/costs").json()
    assert costs["hour"]["fleet"]["requests"] == 0, costs["hour"]["fleet"]


def test_a_stream_cut_mid_answer_is_not_a_connect_failure(sim, gateway):
    dropper = g.phone(sim, "dropper", slots=1, decode_tps=20, fault_plan=DROP_ALWAYS)
    gw, admin = start(gateway, [g.replica(dropper)], health={"interval_s": 0})
    cut_stream(gw)
    fail = g.log_msgs(gw, "attempt failed", replica="dropper")
    assert fail and fail[0]["reason"] == "cut" and fail[0]["stream_started"] is True, fail
    m = admin.metrics()
    assert m['fleetgate_upstream_failures_total{reason="cut"}'] == 1, m
    assert m['fleetgate_upstream_failures_total{reason="connect"}'] == 0, m


SECRET = "fleet-secret-0123456789abcdef"


def hb_gateway(gateway, sim, replicas=(), **fleet_over):
    """A gateway with an admin listener that takes heartbeats (fleet secret SECRET)."""
    from test_admin import TOKEN, TOKEN_ENV, Admin, admin_config  # noqa: PLC0415
    fleet_cfg = {"secret_env": "FG_SECRET", "heartbeat_timeout_s": 15, "heartbeat_interval_s": 0.05}
    fleet_cfg.update(fleet_over)
    d = gateway(lambda ports: dict(admin_config(ports, list(replicas), health={"interval_s": 0.3}),
                                   fleet=fleet_cfg),
                n_ports=2, env={TOKEN_ENV: TOKEN, "FG_SECRET": SECRET},
                ready=lambda dd: (g.replicas_ready(dd) or 0) >= len(replicas))
    return d, Admin(d)


def heartbeat(gw, phone, state="ready"):
    body = {"id": phone.id, "url": phone.url, "models": [g.MODEL], "slots": 1, "busy": 0,
            "state": state, "prefill_tps": 2000, "decode_tps": 100}
    time.sleep(0.1)  # no faster than heartbeat_interval_s
    raw, h = g.heartbeat_headers(body, secret=SECRET)
    r = requests.post(gw.url + "/fleet/v1/heartbeat", data=raw, headers=h, timeout=T(5))
    assert r.status_code == 200, r.text
    return r.json()


def events(admin, type_=None):
    evs = admin.get("/admin/v1/events").json()["events"]
    return [e for e in evs if type_ is None or e["type"] == type_]


def test_reasons_say_what_happened(sim, gateway):
    p1 = g.phone(sim, "p1")
    hb = g.phone(sim, "hb1")
    gw, admin = hb_gateway(gateway, sim, [g.replica(p1)])
    # a drained replica says why it drains, not that its health check passed
    wait_until(lambda: admin.replicas()["p1"]["reason"] == "health check passed", T(10))
    assert admin.post("/admin/v1/replicas/p1/drain").status_code == 200
    r = admin.replicas()["p1"]
    assert r["state"] == "draining" and r["reason"] == "drained by an admin", r
    # a heartbeat phone drained through the gateway drains its agent too (the heartbeat
    # answer says so); enabling it is not "still draining": it takes work at the next
    # heartbeats, and the event that follows says why it is ready again
    assert heartbeat(gw, hb)["drain"] is False
    assert admin.post("/admin/v1/replicas/hb1/drain").status_code == 200
    assert heartbeat(gw, hb, state="draining")["drain"] is True
    assert admin.replicas()["hb1"]["reason"] == "drained by an admin"
    r = admin.post("/admin/v1/replicas/hb1/enable")
    assert r.status_code == 200, r.text
    enabled = events(admin, "replica_enabled")[-1]
    assert "still draining" not in enabled["message"], enabled
    assert "next heartbeat" in enabled["message"], enabled
    assert heartbeat(gw, hb, state="draining")["drain"] is False
    heartbeat(gw, hb, state="ready")
    r = admin.replicas()["hb1"]
    assert r["state"] == "ready" and r["reason"] == "its agent stopped draining", r
    back = [e for e in events(admin, "replica_state") if e["replica"] == "hb1" and e["to"] == "ready"]
    assert back and back[-1]["reason"] == "its agent stopped draining", back


def test_phones_joining_and_leaving_show_in_the_events(sim, gateway):
    hb, p1 = g.phone(sim, "hb1"), g.phone(sim, "p1")
    gw, admin = hb_gateway(gateway, sim, heartbeat_timeout_s=0.3)
    heartbeat(gw, hb)
    joined = events(admin, "replica_registered")
    assert [e["replica"] for e in joined] == ["hb1"], joined
    assert joined[0]["url"] == hb.url and "joined" in joined[0]["message"], joined
    # silent for 10 × heartbeat_timeout_s: it leaves the registry, and the feed says so
    wait_until(lambda: events(admin, "replica_removed"), T(15), what="replica_removed event")
    left = events(admin, "replica_removed")
    assert left[0]["replica"] == "hb1" and "heartbeat" in left[0]["reason"], left
    assert "hb1" not in admin.replicas()
    # a replica removed from the configuration leaves once nothing runs there
    cfg = json.loads(gw.config_path.read_text())
    cfg["replicas"] = [g.replica(p1)]
    gw.config_path.write_text(json.dumps(cfg))
    assert admin.post("/admin/v1/reload").status_code == 200
    cfg["replicas"] = []
    gw.config_path.write_text(json.dumps(cfg))
    assert admin.post("/admin/v1/reload").status_code == 200
    wait_until(lambda: len(events(admin, "replica_removed")) >= 2, T(10), what="p1 removed event")
    gone = events(admin, "replica_removed")[-1]
    assert gone["replica"] == "p1" and "removed from the configuration" in gone["reason"], gone
    # the status page's feed is the same ring
    st = admin.get("/admin/v1/status").json()
    assert {"replica_registered", "replica_removed"} <= {e["type"] for e in st["events"]}, st["events"]


def login(admin, **headers):
    r = requests.post(admin.url + "/admin/v1/session", headers=dict(AUTH, **headers), timeout=T(5))
    assert r.status_code == 200, r.text
    set_cookie = r.headers["Set-Cookie"]
    value = set_cookie.split(";")[0].split("=", 1)[1]
    return r, set_cookie, {"Cookie": f"fleetgate_session={value}"}


def test_one_login_gives_a_browser_a_session_cookie(sim, gateway):
    p1 = g.phone(sim, "p1")
    gw, admin = start(gateway, [g.replica(p1)])
    url = admin.url
    # no session, no token: reads are refused (public_read is off), and the page is told
    # so without a 401
    assert requests.get(url + "/admin/v1/status", timeout=T(5)).status_code == 401
    st = requests.get(url + "/admin/v1/session", timeout=T(5)).json()
    assert st == {"session": False, "read_needs_token": True, "sessions": True}, st
    # a login needs the token itself
    r = requests.post(url + "/admin/v1/session", timeout=T(5))
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_admin_token"
    r = requests.post(url + "/admin/v1/session", timeout=T(5),
                      headers={"Authorization": "Bearer not-the-admin-token-at-all"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_admin_token"
    r, set_cookie, cookie = login(admin)
    attrs = [a.strip() for a in set_cookie.split(";")]
    assert "HttpOnly" in attrs and "SameSite=Strict" in attrs and "Path=/admin/v1/" in attrs, attrs
    assert "Secure" not in attrs, attrs  # plain HTTP: a Secure cookie would never come back
    assert any(a.startswith("Max-Age=43200") for a in attrs), attrs
    assert TOKEN not in set_cookie
    # behind a TLS proxy it is Secure
    _, sc, _ = login(admin, **{"X-Forwarded-Proto": "https"})
    assert "Secure" in [a.strip() for a in sc.split(";")], sc
    # the cookie reads everything the page reads
    assert requests.get(url + "/admin/v1/session", headers=cookie, timeout=T(5)).json()["session"] is True
    r = requests.get(url + "/admin/v1/status", headers=cookie, timeout=T(5))
    assert r.status_code == 200 and r.json()["replicas"][0]["id"] == "p1", r.text
    # a change from a session needs the header the page sends (another site cannot)
    r = requests.post(url + "/admin/v1/replicas/p1/drain", headers=cookie, timeout=T(5))
    assert r.status_code == 403 and r.json()["error"]["code"] == "csrf_header_missing", r.text
    assert admin.state("p1") == "ready"
    r = requests.post(url + "/admin/v1/replicas/p1/drain", headers=dict(cookie, **CSRF), timeout=T(5))
    assert r.status_code == 200 and r.json()["state"] == "draining", r.text
    # a session cannot renew itself
    r = requests.post(url + "/admin/v1/session", headers=dict(cookie, **CSRF), timeout=T(5))
    assert r.status_code == 401
    # a forged or altered value is nobody's session
    v = cookie["Cookie"].split("=", 1)[1]
    exp, nonce, mac = v.split(".")
    for bad in (f"{int(exp) + 1000}.{nonce}.{mac}", f"{exp}.{nonce}.{'0' * 64}", "x", TOKEN):
        r = requests.get(url + "/admin/v1/status", headers={"Cookie": f"fleetgate_session={bad}"},
                         timeout=T(5))
        assert r.status_code == 401, bad
    # logging out drops the cookie
    r = requests.delete(url + "/admin/v1/session", headers=cookie, timeout=T(5))
    assert r.status_code == 200 and "Max-Age=0" in r.headers["Set-Cookie"], r.headers


def test_signing_out_ends_the_session(sim, gateway, tmp_path):
    """DELETE /admin/v1/session ends the session on the gateway, not only in the browser:
    the old cookie (copied before, as a thief would) is refused with 401 by the page's
    data and by the admin API, the page's open stream ends, a restart (data_dir) keeps it
    ended; another browser's session and the token go on working."""
    from test_admin import SSEReader  # noqa: PLC0415
    p1 = g.phone(sim, "p1")
    data = tmp_path / "data"
    data.mkdir()
    gw, admin = start(gateway, [g.replica(p1)], data_dir=str(data))
    url = admin.url
    _, _, cookie = login(admin)
    _, _, other = login(admin)
    assert cookie != other
    for c in (cookie, other):
        assert requests.get(url + "/admin/v1/status", headers=c, timeout=T(5)).status_code == 200
    stream = SSEReader(url + "/admin/v1/status", cookie)
    assert stream.resp.status_code == 200
    assert stream.wait_for(lambda s: s.named("hello"), T(5))
    r = requests.delete(url + "/admin/v1/session", headers=cookie, timeout=T(5))
    assert r.status_code == 200 and "Max-Age=0" in r.headers["Set-Cookie"], r.headers
    assert r.json() == {"session": False}

    def refused(c):
        assert requests.get(url + "/admin/v1/session", headers=c, timeout=T(5)).json()["session"] is False
        for path in ("/admin/v1/status", "/admin/v1/replicas", "/admin/v1/events", "/metrics"):
            r = requests.get(url + path, headers=c, timeout=T(5))
            assert r.status_code == 401 and r.json()["error"]["code"] == "missing_admin_token", (path, r.text)
        r = requests.get(url + "/admin/v1/status", headers=dict(c, Accept="text/event-stream"), timeout=T(5))
        assert r.status_code == 401, r.text
        r = requests.post(url + "/admin/v1/replicas/p1/drain", headers=dict(c, **CSRF), timeout=T(5))
        assert r.status_code == 401, r.text
        assert admin.state("p1") == "ready"

    refused(cookie)
    assert wait_until(lambda: stream.ended, T(5)), "the signed-out session's stream stayed open"
    stream.close()
    # the other browser, and the token, are not signed out
    assert requests.get(url + "/admin/v1/status", headers=other, timeout=T(5)).status_code == 200
    assert admin.get("/admin/v1/status").status_code == 200
    assert any(r.get("msg") == "admin session ended" for r in g.log_records(gw)), gw.logs()
    kept = data / "sessions-ended.json"
    assert oct(kept.stat().st_mode & 0o777) == oct(0o600)
    # a second sign-out of the same value changes nothing; a restart keeps it ended
    assert requests.delete(url + "/admin/v1/session", headers=cookie, timeout=T(5)).status_code == 200
    gw.stop()
    gw, admin = start(gateway, [g.replica(p1)], data_dir=str(data))
    url = admin.url
    refused(cookie)
    assert requests.get(url + "/admin/v1/status", headers=other, timeout=T(5)).status_code == 200


def test_sessions_expire_and_can_be_turned_off(sim, gateway):
    p1 = g.phone(sim, "p1")
    gw, admin = start(gateway, [g.replica(p1)], admin_extra={"session_ttl_s": 1})
    _, _, cookie = login(admin)
    assert requests.get(admin.url + "/admin/v1/status", headers=cookie, timeout=T(5)).status_code == 200
    time.sleep(1.3)
    assert requests.get(admin.url + "/admin/v1/status", headers=cookie, timeout=T(5)).status_code == 401
    gw2, admin2 = start(gateway, [g.replica(p1)], admin_extra={"session_ttl_s": 0})
    r = requests.post(admin2.url + "/admin/v1/session", headers=AUTH, timeout=T(5))
    assert r.status_code == 404 and r.json()["error"]["code"] == "sessions_disabled", r.text
    # a cookie of the first gateway (same token) opens nothing where sessions are off
    _, _, c2 = login(admin)
    assert requests.get(admin2.url + "/admin/v1/status", headers=c2, timeout=T(5)).status_code == 401


@pytest.mark.usefixtures("_browser_installed")
def test_the_status_page_signs_in_once_per_browser(sim, gateway, browser):
    """One sign-in opens a session: a new tab shows the fleet without asking, and a drain
    from the page goes through with the cookie (and the page's CSRF header) alone."""
    p1, p2 = g.phone(sim, "p1"), g.phone(sim, "p2")
    gw, admin = start(gateway, [g.replica(p1), g.replica(p2)])
    drv = browser
    drv.get(admin.url + "/")
    assert wait_until(lambda: drv.find_element(By.ID, "modal").is_displayed(), T(10)), "no token dialog"
    drv.find_element(By.ID, "modal-token").send_keys(TOKEN)
    drv.find_element(By.ID, "modal-ok").click()
    assert wait_until(lambda: text(drv, "conn") == "live", T(10)), text(drv, "conn")
    # the token is not kept in the page: the session cookie is (and JavaScript cannot read it)
    assert drv.execute_script("return sessionStorage.getItem('fleetgate.admin_token')") is None
    assert "fleetgate_session" not in drv.execute_script("return document.cookie")
    # a new tab: no dialog, the fleet at once
    drv.switch_to.new_window("tab")
    drv.get(admin.url + "/")
    assert wait_until(lambda: text(drv, "conn") == "live", T(10)), text(drv, "conn")
    assert not drv.find_element(By.ID, "modal").is_displayed()
    assert wait_until(lambda: text(drv, "n-ready") == "2", T(10)), text(drv, "n-ready")
    # a drain with an empty token field: the session and the page's header carry it

    def click_drain():
        drv.find_element(By.CSS_SELECTOR, '#replicas tbody tr[data-replica="p2"] button.act').click()
    fresh(click_drain)
    assert wait_until(lambda: drv.find_element(By.ID, "modal").is_displayed(), T(5))
    assert drv.find_element(By.ID, "modal-token").get_attribute("value") == ""
    drv.find_element(By.ID, "modal-ok").click()
    assert wait_until(lambda: admin.state("p2") == "draining", T(5)), admin.state("p2")
    assert not console_errors(drv), console_errors(drv)


def test_admin_drains_survive_a_restart_with_data_dir(sim, gateway, tmp_path):
    """A restart (needed for a new fleet section: the environment is the process's own)
    keeps the admin's drains when there is a data_dir: config replicas at once, heartbeat
    phones at their first heartbeat after it. Enabled ones stay enabled."""
    from test_admin import TOKEN_ENV, Admin, admin_config  # noqa: PLC0415
    data = tmp_path / "data"
    data.mkdir()
    p1, p2, hb = g.phone(sim, "p1"), g.phone(sim, "p2"), g.phone(sim, "hb1")
    fleet_cfg = {"secret_env": "FG_SECRET", "heartbeat_timeout_s": 15, "heartbeat_interval_s": 0.05}

    def run(ready):
        d = gateway(lambda ports: dict(admin_config(ports, [g.replica(p1), g.replica(p2)]),
                                       fleet=fleet_cfg, data_dir=str(data)),
                    n_ports=2, env={TOKEN_ENV: TOKEN, "FG_SECRET": SECRET},
                    ready=lambda dd: (g.replicas_ready(dd) or 0) >= ready)
        return d, Admin(d)

    gw, admin = run(2)
    heartbeat(gw, hb)
    for rid in ("p1", "p2", "hb1"):
        assert admin.post(f"/admin/v1/replicas/{rid}/drain").status_code == 200
    assert admin.post("/admin/v1/replicas/p2/enable").status_code == 200
    gw.stop()
    gw, admin = run(1)
    reps = admin.replicas()
    assert reps["p1"]["state"] == "draining" and reps["p1"]["drain"]["admin"] is True, reps["p1"]
    assert reps["p1"]["reason"] == "drained by an admin", reps["p1"]
    assert reps["p2"]["state"] == "ready", reps["p2"]
    # the heartbeat phone is drained again as it rejoins, and its agent is told
    assert heartbeat(gw, hb)["drain"] is True
    assert admin.replicas()["hb1"]["drain"]["admin"] is True
    for i in range(4):
        assert g.chat(gw, content=f"r{i}", max_tokens=2).headers["x-fleetgate-replica"] == "p2"
    # enabling after the restart is kept too
    assert admin.post("/admin/v1/replicas/p1/enable").status_code == 200
    gw.stop()
    gw, admin = run(2)
    assert admin.replicas()["p1"]["state"] == "ready"
