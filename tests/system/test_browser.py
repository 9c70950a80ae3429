"""The status page in a real browser (issue 7): Debian's headless Chromium driven by
Selenium opens the page on the admin listener, signs in with the admin token, sees the
right number of replicas in each state, sees a phone turn "down" within 5 seconds of
being killed and "ready" again once it is back, drains a phone with the button (the
token dialog handled), and finds no errors in the browser console. Screenshots at a
laptop's and a phone's size are saved as test artifacts (FLEETGATE_ARTIFACTS, default
/tmp/fleetgate-artifacts). At 1,280 and 800 px wide, no caption is cut, spills out of its
box or overlaps another (the elements' boxes measured, not pixels), and amounts are
written out (no 6.60e-4).

Skips, saying why, only when chromium, chromedriver or python3-selenium is missing."""

import os
import re
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest

import fleet
import gwutil as g
from fleet import T, wait_until
from gwutil import phone, replica
from test_admin import TOKEN, TOKEN_ENV, Admin, admin_config, rewrite_config

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
except ImportError:  # pragma: no cover - the skip below says so
    webdriver = None

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver") or (
    "/usr/bin/chromedriver" if os.access("/usr/bin/chromedriver", os.X_OK) else None)
ARTIFACTS = Path(os.environ.get("FLEETGATE_ARTIFACTS") or "/tmp/fleetgate-artifacts")


@pytest.fixture(autouse=True)
def _browser_installed():
    why = "the browser tests need it (apt-get install chromium chromium-driver python3-selenium)"
    for name, found in (("chromium", CHROMIUM), ("chromium-driver", CHROMEDRIVER),
                        ("python3-selenium", webdriver)):
        fleet.need_tool(name, why, found=found or False)


@pytest.fixture
def browser():
    profile = tempfile.mkdtemp(prefix="fleetgate-chromium-")
    opts = Options()
    opts.binary_location = CHROMIUM
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--disable-background-networking", "--no-first-run", "--disable-extensions",
              f"--user-data-dir={profile}", "--window-size=1366,900"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    drv.set_page_load_timeout(T(30))
    try:
        yield drv
    finally:
        try:
            drv.quit()
        finally:
            shutil.rmtree(profile, ignore_errors=True)


def console_errors(drv):
    return [e for e in drv.get_log("browser") if e.get("level") == "SEVERE"]


def fresh(read, tries=20):
    """The live page re-renders its table and cards; an element found a moment ago may be
    gone. Read again with a freshly found element (bounded)."""
    from selenium.common.exceptions import StaleElementReferenceException  # noqa: PLC0415
    for _ in range(tries):
        try:
            return read()
        except StaleElementReferenceException:
            time.sleep(0.02)
    return read()


def text(drv, id_):
    return fresh(lambda: drv.find_element(By.ID, id_).text)


def row_state(drv, rid):
    def read():
        rows = drv.find_elements(By.CSS_SELECTOR, f'#replicas tbody tr[data-replica="{rid}"]')
        return rows[0].get_attribute("data-state") if rows else None
    return fresh(read)


def counts(drv):
    return {k: text(drv, f"n-{k}") for k in ("ready", "busy", "loading", "down", "draining")}


def sign_in(drv, url):
    """Open the status page at url, give the admin token its dialog asks for, and wait
    until the dialog is gone and the page's stream is live."""
    drv.get(url + "/")
    assert wait_until(lambda: drv.find_element(By.ID, "modal").is_displayed(), T(10)), "no token dialog"
    drv.find_element(By.ID, "modal-token").send_keys(TOKEN)
    drv.find_element(By.ID, "modal-ok").click()
    assert wait_until(lambda: not drv.find_element(By.ID, "modal").is_displayed(), T(10))
    assert wait_until(lambda: text(drv, "conn") == "live", T(10)), text(drv, "conn")


def shot(drv, name, width, height):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    drv.set_window_size(width, height)
    time.sleep(0.5)
    # the whole page, not only the first screen
    full = drv.execute_script("return document.documentElement.scrollHeight")
    drv.set_window_size(width, max(height, min(int(full) + 120, 4000)))
    time.sleep(0.5)
    path = ARTIFACTS / name
    drv.save_screenshot(str(path))
    assert path.stat().st_size > 10000, path
    return path


def test_status_page_in_chromium(sim, gateway, procs, browser):
    health = {"interval_s": 0.3, "timeout_s": 0.5, "rise": 1, "fall": 2,
              "cooldown_s": 1, "down_interval_s": 0.3}
    phones = [phone(sim, "pixel-01", slots=2), phone(sim, "pixel-02", slots=1),
              phone(sim, "galaxy-03", slots=1), phone(sim, "moto-04", slots=4)]
    reps = [replica(p, cost_per_day=c, labels={"device": p.id.split("-")[0]})
            for p, c in zip(phones, (0.6, 0.6, 0.45, 0.3))]
    reps[3]["drain"] = True  # draining from its config
    d = gateway(lambda ports: admin_config(ports, reps, health=health), n_ports=2,
                env={TOKEN_ENV: TOKEN}, ready=lambda dd: (g.replicas_ready(dd) or 0) >= 3)
    a = Admin(d)
    for i in range(4):  # a little traffic for the numbers and the log
        g.check_chat_ok(g.chat(d, content=f"hello {i}", max_tokens=6))

    drv = browser
    # the page asks for the admin token first
    sign_in(drv, a.url)

    want = {"ready": "3", "busy": "0", "loading": "0", "down": "0", "draining": "1"}
    assert wait_until(lambda: counts(drv) == want, T(10)), counts(drv)
    assert len(drv.find_elements(By.CSS_SELECTOR, "#replicas tbody tr")) == 4
    assert row_state(drv, "moto-04") == "draining"
    assert text(drv, "cost") == "1.950", text(drv, "cost")  # ACU: four significant digits
    assert text(drv, "n-total") == "4 replicas"
    # the costs: the fleet's hour and day, and the model and key the traffic used
    assert wait_until(lambda: text(drv, "costs-currency") == "(ACU)", T(5)), text(drv, "costs-currency")
    assert len(drv.find_elements(By.CSS_SELECTOR, "#costs-fleet tbody tr")) == 2
    for table, name in (("costs-models", g.MODEL), ("costs-keys", "anonymous")):
        sel = f'#{table} tbody tr[data-name="{name}"] td'
        assert wait_until(lambda: len(drv.find_elements(By.CSS_SELECTOR, sel)) == 7, T(5)), table
        cells = fresh(lambda: [c.text for c in drv.find_elements(By.CSS_SELECTOR, sel)])
        assert all(c not in ("", "–", "0") for c in cells[1:]), cells  # 4 requests served
    assert text(drv, "idle-cost") not in ("", "–", "0"), text(drv, "idle-cost")
    # the capacity panel: the model's phones as the advice counts them (the usable ones)
    sel = f'#capacity-models tbody tr[data-name="{g.MODEL}"] td'
    assert wait_until(lambda: len(drv.find_elements(By.CSS_SELECTOR, sel)) == 11, T(5)), sel
    cells = fresh(lambda: [c.text for c in drv.find_elements(By.CSS_SELECTOR, sel)])
    assert cells[6] in ("yes", "no") and cells[1].isdigit(), cells

    # filter and sort
    f = drv.find_element(By.ID, "filter")
    f.send_keys("pixel")
    assert wait_until(lambda: len(drv.find_elements(By.CSS_SELECTOR, "#replicas tbody tr")) == 2, T(3))
    f.clear()
    f.send_keys(" ")  # an input event with an empty filter
    f.clear()
    drv.execute_script("document.getElementById('filter').dispatchEvent(new Event('input'))")
    assert wait_until(lambda: len(drv.find_elements(By.CSS_SELECTOR, "#replicas tbody tr")) == 4, T(3))
    drv.find_element(By.CSS_SELECTOR, '#replicas th[data-key="cost_per_day"]').click()
    first = lambda: fresh(lambda: drv.find_elements(By.CSS_SELECTOR, "#replicas tbody tr")[0].get_attribute("data-replica"))  # noqa: E731
    assert wait_until(lambda: first() == "moto-04", T(3)), first()
    drv.find_element(By.CSS_SELECTOR, '#replicas th[data-key="cost_per_day"]').click()
    assert wait_until(lambda: first() in ("pixel-01", "pixel-02"), T(3)), first()

    shot(drv, "status-page-laptop.png", 1366, 900)

    # a phone that dies shows "down" within 5 seconds
    victim = phones[2]
    port = victim.port
    t0 = time.monotonic()
    victim.proc.send_signal(signal.SIGKILL)
    victim.check_exit = False
    assert wait_until(lambda: row_state(drv, "galaxy-03") == "down", 5.0, interval=0.1), \
        (row_state(drv, "galaxy-03"), time.monotonic() - t0)
    assert wait_until(lambda: text(drv, "n-down") == "1", T(3)), counts(drv)
    assert wait_until(lambda: "galaxy-03 is down" in text(drv, "events"), T(3)), text(drv, "events")

    # ... and "ready" again once it is back on its address
    procs.spawn("galaxy-03-again",
                lambda ports: fleet.sim_argv(port, slots=1, prefill_tps=200, decode_tps=10,
                                             time_scale=g.SCALE, id="galaxy-03"),
                n_ports=0, ready=lambda dd: fleet.port_accepts(port))
    assert wait_until(lambda: row_state(drv, "galaxy-03") in ("ready", "busy"), T(10)), \
        row_state(drv, "galaxy-03")

    # drain a phone with its button; the dialog has the token already
    def click_drain():
        btn = drv.find_element(By.CSS_SELECTOR,
                               '#replicas tbody tr[data-replica="pixel-02"] button.act')
        assert btn.text == "Drain"
        btn.click()
    fresh(click_drain)
    assert wait_until(lambda: drv.find_element(By.ID, "modal").is_displayed(), T(5))
    assert "pixel-02" in text(drv, "modal-title")
    drv.find_element(By.ID, "modal-ok").click()
    assert wait_until(lambda: row_state(drv, "pixel-02") == "draining", T(5)), row_state(drv, "pixel-02")
    assert a.state("pixel-02") == "draining"
    assert wait_until(lambda: text(drv, "n-draining") == "2", T(5)), counts(drv)
    assert wait_until(lambda: "pixel-02 drained by an admin" in text(drv, "events"), T(5))

    # the page at a phone's size: no sideways scrolling of the page itself
    shot(drv, "status-page-laptop-after.png", 1366, 900)
    drv.set_window_size(390, 844)
    time.sleep(0.5)
    overflow = drv.execute_script(
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 1, f"the page scrolls sideways by {overflow}px on a phone"
    shot(drv, "status-page-phone.png", 390, 844)

    errs = console_errors(drv)
    assert not errs, errs


def test_batches_on_the_status_page(sim, gateway, browser, tmp_path):
    """A running batch is on the page with its progress; a second one waits for the one run
    slot (batch.max_running 1) and says so; the Keys table shows the caller's use against
    its quotas; the Cancel button (token dialog) cancels the first, and the row says so."""
    import test_batch as tb
    # ~0.8 s a line (8 tokens at 1 token/s, the sims' scale 10): the batch runs half a
    # minute, well past the page's sign-in on a loaded machine (at 0.16 s a line it had
    # ended before the page was up, in the suite's three workers)
    ph = phone(sim, "slow-01", slots=1, decode_tps=1)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    d = gateway(lambda ports: admin_config(ports, [replica(ph)], data_dir=str(data_dir),
                                           batch={"window": 1, "max_running": 1}),
                n_ports=2, env={TOKEN_ENV: TOKEN}, ready=lambda dd: (g.replicas_ready(dd) or 0) >= 1)
    f = tb.upload_ok(d, tb.jsonl([tb.line(f"c-{i}", f"case {i}", max_tokens=8) for i in range(40)]))
    b = tb.create_ok(d, f["id"])
    assert wait_until(lambda: tb.get_batch(d, b["id"])["request_counts"]["completed"] >= 1, T(20))
    f2 = tb.upload_ok(d, tb.jsonl([tb.line("w-1", "waits")]))
    b2 = tb.create_ok(d, f2["id"])

    drv = browser
    sign_in(drv, Admin(d).url)
    row = f'#batches tbody tr[data-batch="{b["id"]}"]'
    assert wait_until(lambda: fresh(lambda: drv.find_element(By.CSS_SELECTOR, row)
                                    .get_attribute("data-status")) == "in_progress", T(10))
    cells = fresh(lambda: [c.text for c in drv.find_elements(By.CSS_SELECTOR, row + " td")])
    assert cells[1] == "–", cells  # an open gateway: no key owns it
    assert int(cells[4]) >= 1 and int(cells[5]) == 0, cells  # done, failed
    assert 0 < int(cells[6]) < 40, cells  # left
    bar = fresh(lambda: drv.find_element(By.CSS_SELECTOR, row + " .bar .done").get_attribute("style"))
    assert "width" in bar, bar
    # the second waits for the run slot, and the page says so
    row2 = f'#batches tbody tr[data-batch="{b2["id"]}"]'
    assert wait_until(lambda: fresh(lambda: drv.find_element(By.CSS_SELECTOR, row2 + " td:nth-child(3)")
                                    .text) == "validating · queued", T(10))
    # the one caller's use against its quotas: 2 files, 2 batches of 100, one queued
    keyrow = '#keys tbody tr[data-key="anonymous"]'
    assert wait_until(lambda: drv.find_elements(By.CSS_SELECTOR, keyrow), T(10))
    kc = fresh(lambda: [c.text for c in drv.find_elements(By.CSS_SELECTOR, keyrow + " td")])
    assert kc[1] == "2 / 10000" and kc[4] == "2 / 100" and kc[5] == "1", kc
    assert kc[2].endswith("/ 2.0 GiB") and kc[3].endswith("/ 60"), kc

    fresh(lambda: drv.find_element(By.CSS_SELECTOR, row + " button.act").click())
    assert wait_until(lambda: drv.find_element(By.ID, "modal").is_displayed(), T(5))
    assert b["id"] in text(drv, "modal-title")
    drv.find_element(By.ID, "modal-ok").click()
    assert wait_until(lambda: fresh(lambda: drv.find_element(By.CSS_SELECTOR, row)
                                    .get_attribute("data-status")) == "cancelled", T(10))
    assert tb.get_batch(d, b["id"])["status"] == "cancelled"
    assert not drv.find_elements(By.CSS_SELECTOR, row + " button.act")
    # the slot it held went to the one waiting
    assert tb.wait_batch(d, b2["id"], timeout=20)["status"] == "completed"
    shot(drv, "status-page-batches.png", 1366, 900)
    errs = console_errors(drv)
    assert not errs, errs


def test_device_readings_on_the_status_page(procs, gateway, browser, tmp_path):
    """A phone that joins by heartbeat with readings from a fake /sys (--sysfs-root) shows
    its battery (⚡ while charging), its temperature and, on hovering the temperature, how
    far its CPU clock is capped; a phone that reports none shows "–"."""
    import test_agent as ta
    root = tmp_path / "phone-root"
    ta.fake_phone(root)  # 81 %, charging, 61.2 °C, big cores capped to half
    d = gateway(lambda ports: dict(admin_config(ports, []), fleet={
        "secret_env": "FLEETGATE_FLEET_SECRET", "replica_token_env": "FLEETGATE_REPLICA_TOKEN",
        "heartbeat_timeout_s": 30}), n_ports=2, env=dict(ta.GW_ENV, **{TOKEN_ENV: TOKEN}))
    for pid, extra in (("phone-dev", ("--sysfs-root", str(root))), ("phone-bare", ("--sysfs-root", str(tmp_path)))):
        procs.spawn(pid, lambda ports, pid=pid, extra=extra: fleet.sim_argv(
            ports[0], id=pid, extra_args=("--gateway", d.url, "--public-url", f"http://{fleet.HOST}:{ports[0]}",
                                          *extra)), env=ta.GW_ENV)
    drv = browser
    sign_in(drv, Admin(d).url)

    def cells(rid):
        row = f'#replicas tbody tr[data-replica="{rid}"]'
        heads = [h.get_attribute("data-key") for h in drv.find_elements(By.CSS_SELECTOR, "#replicas thead th")]
        tds = drv.find_elements(By.CSS_SELECTOR, row + " td")
        return {k: (c.text, c.get_attribute("title")) for k, c in zip(heads, tds)}

    assert wait_until(lambda: fresh(lambda: cells("phone-dev").get("battery_pct", ("",))[0]) == "81 % ⚡", T(15)), \
        fresh(lambda: cells("phone-dev"))
    dev = fresh(lambda: cells("phone-dev"))
    assert dev["temperature_c"][0] == "61 °C", dev
    assert dev["temperature_c"][1] == f"CPU clock capped to {round(ta.CPU_HALF_BIG * 100)} % of its top", dev
    assert wait_until(lambda: fresh(lambda: cells("phone-bare").get("battery_pct", ("",))[0]) == "–", T(15))
    bare = fresh(lambda: cells("phone-bare"))
    assert bare["temperature_c"][0] == "–" and not bare["temperature_c"][1], bare

    # held back by its readings (scheduler.device): a marker by its state, the reason on hover
    def held(rid):
        def read():
            m = drv.find_elements(By.CSS_SELECTOR, f'#replicas tbody tr[data-replica="{rid}"] .held')
            return (m[0].text, m[0].get_attribute("title")) if m else None
        return fresh(read)
    assert wait_until(lambda: held("phone-dev") is not None, T(10)), fresh(lambda: cells("phone-dev"))
    mark, why = held("phone-dev")
    assert mark == "held back" and why.startswith("held back: 61.2 °C, over 45 °C"), (mark, why)
    assert "planned 1.5× slower" in why, why
    assert held("phone-bare") is None
    # at 8 % and unplugged: no new work, and the page says why
    ta.fake_phone(root, capacity="8", status="Discharging", cpu_temp="30000", big_cap="2841600")
    assert wait_until(lambda: (held("phone-dev") or ("",))[0] == "held: no new work", T(15)), held("phone-dev")
    mark, why = held("phone-dev")
    assert "battery 8 % and not charging: under the floor of 10 %" in why, why
    shot(drv, "status-held-back.png", 1366, 900)
    assert not console_errors(drv)


def test_a_suspect_phone_on_the_status_page(sim, gateway, browser):
    """A phone whose health check failed, or whose check in flight is late, is *suspect*
    while it is not marked down yet (here never: fall 1000): new work goes elsewhere. The
    page marks it by its state, with the check's error on hover, and the mark goes once
    the phone answers again."""
    health = {"interval_s": 0.3, "timeout_s": 0.6, "late_s": 0.3, "fall": 1000}
    frozen, other = phone(sim, "frozen", slots=1), phone(sim, "other", slots=1)
    d = gateway(lambda ports: admin_config(ports, [replica(frozen), replica(other)], health=health),
                n_ports=2, env={TOKEN_ENV: TOKEN}, ready=lambda dd: (g.replicas_ready(dd) or 0) >= 2)
    drv = browser
    sign_in(drv, Admin(d).url)

    def mark(rid):
        def read():
            m = [e for e in drv.find_elements(By.CSS_SELECTOR, f'#replicas tbody tr[data-replica="{rid}"] .held')
                 if e.text == "suspect"]
            return (m[0].text, m[0].get_attribute("title")) if m else None
        return fresh(read)

    assert wait_until(lambda: row_state(drv, "frozen") == "ready", T(10))
    assert mark("frozen") is None
    frozen.proc.send_signal(signal.SIGSTOP)
    try:
        assert wait_until(lambda: mark("frozen") is not None, T(10)), row_state(drv, "frozen")
        _, why = mark("frozen")
        assert why.startswith("suspect: ") and len(why) > len("suspect: "), why
        assert ("unanswered" in why or "timed out" in why.lower() or "timeout" in why.lower()), why
        assert row_state(drv, "frozen") == "ready"  # suspect, not down
        assert mark("other") is None
        shot(drv, "status-suspect.png", 1366, 900)
    finally:
        frozen.proc.send_signal(signal.SIGCONT)
    assert wait_until(lambda: mark("frozen") is None, T(10)), mark("frozen")
    assert not console_errors(drv)


# What a caption is: the cards' label, value, sub-lines and reasons, the charts' captions
# and axis labels, the header's items and the section titles.
CAPTIONS = ".card .label, .card .value, .card .sub, .card .why li, figcaption, figcaption .key, " \
           ".axis > span, header > *, main h2"
# Measured in the page: each caption cut (its text wider than its box), out of the box
# it sits in, or overlapping another caption or card; and, where one line is wanted,
# captions on more than one.
LAYOUT_JS = r"""
const [sel, oneLine] = arguments;
const name = (e) => (e.id ? '#' + e.id : e.tagName.toLowerCase() + (e.className ? '.' + e.className : ''))
                    + ' "' + e.textContent.trim().slice(0, 40) + '"';
const els = [...document.querySelectorAll(sel)].filter((e) => e.getClientRects().length && e.textContent.trim());
const out = [];
const box = (e) => e.parentElement.closest('.card, figure, header, main, section');
for (const e of els) {
  const cs = getComputedStyle(e);
  if (cs.display !== 'inline' && e.scrollWidth > e.clientWidth + 1)
    out.push('cut: ' + name(e) + ' needs ' + e.scrollWidth + ' px, has ' + e.clientWidth);
  const r = e.getBoundingClientRect(), b = box(e).getBoundingClientRect();
  if (r.left < b.left - 0.5 || r.right > b.right + 0.5)
    out.push('outside its box: ' + name(e) + ' [' + r.left + ', ' + r.right + '] in [' + b.left + ', ' + b.right + ']');
  if (oneLine && e.matches('.card .label, .card .sub:not(ul), .card .why li, figcaption')) {
    // the lines its text takes: the text's boxes, those whose middles differ by more
    // than half a line counting apart
    const mids = [];
    const walk = document.createTreeWalker(e, NodeFilter.SHOW_TEXT);
    for (let t = walk.nextNode(); t; t = walk.nextNode()) {
      const range = document.createRange();
      range.selectNodeContents(t);
      for (const q of range.getClientRects()) if (q.width > 0) mids.push((q.top + q.bottom) / 2);
    }
    const half = parseFloat(cs.fontSize) / 2;
    const lines = mids.sort((x, y) => x - y).filter((m, i, all) => i === 0 || m - all[i - 1] > half).length;
    if (lines > 1) out.push('wraps: ' + name(e) + ' on ' + lines + ' lines');
  }
}
const over = (a, b) => Math.min(a.right, b.right) - Math.max(a.left, b.left) > 0.5 &&
                       Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 0.5;
for (let i = 0; i < els.length; i++)
  for (let j = i + 1; j < els.length; j++) {
    const a = els[i], b = els[j];
    if (a.contains(b) || b.contains(a)) continue;
    if (over(a.getBoundingClientRect(), b.getBoundingClientRect()))
      out.push('overlap: ' + name(a) + ' and ' + name(b));
  }
const cards = [...document.querySelectorAll('.card')];
for (let i = 0; i < cards.length; i++)
  for (let j = i + 1; j < cards.length; j++)
    if (over(cards[i].getBoundingClientRect(), cards[j].getBoundingClientRect()))
      out.push('overlap: ' + name(cards[i]) + ' and ' + name(cards[j]));
return out;
"""


def layout_problems(drv, one_line):
    return fresh(lambda: drv.execute_script(LAYOUT_JS, CAPTIONS, one_line))


def sig_digits(s):
    """Significant digits of a number written out ("0.0006600" -> 4, "1.950" -> 4)."""
    d = s.replace(",", "").replace("-", "").replace(".", "").lstrip("0")
    return len(d)


def test_captions_fit_and_amounts_are_written_out(sim, gateway, browser):
    """The status page at 1,280 and 800 px (and a phone's 390) with a queue that waits for
    a faster phone: screenshots of each; no caption cut, outside its card or overlapping
    another (at 1,280 px each on one line; narrower, wrapped rather than cut); the Queue card says why
    requests wait while a phone is free; costs in ACU with four significant digits and
    after a reload in EUR to the cent, never in scientific notation."""
    fast = phone(sim, "flagship-01", slots=1, decode_tps=4)   # 600 tokens: 15 s (at the sims' scale)
    slow = phone(sim, "budget-01", slots=2, decode_tps=0.02)  # 600 tokens: 50 min
    reps = [replica(fast, cost_per_day=1.03), replica(slow, cost_per_day=0.3)]
    # the queue is planned request by request here (fill_idle off): three requests at once
    # read as a rate that would have the idle slow phone take two (test_scheduler.c tests
    # that rule); this page shows requests waiting for the faster phone
    d = gateway(lambda ports: admin_config(ports, reps, scheduler={"expected_output_tokens": 600,
                                                                   "fill_idle": False},
                                           shutdown_timeout_s=1),
                n_ports=2, env={TOKEN_ENV: TOKEN}, ready=lambda dd: (g.replicas_ready(dd) or 0) >= 2)
    a = Admin(d)
    conns = [g.open_chat(d.ports[0], content=f"long {i}", max_tokens=600) for i in range(3)]
    try:
        assert wait_until(lambda: a.get("/admin/v1/queue").json()["waiting"]["faster_phone"] == 2, T(10)), \
            a.get("/admin/v1/queue").json()
        drv = browser
        sign_in(drv, a.url)
        why = lambda: fresh(lambda: [(li.get_attribute("data-why"), li.text)  # noqa: E731
                                     for li in drv.find_elements(By.CSS_SELECTOR, "#q-why li")])
        assert wait_until(lambda: why() == [("faster_phone", "2 waiting for a faster phone")], T(10)), why()
        assert text(drv, "q-depth") == "2"
        assert wait_until(lambda: text(drv, "costs-currency") == "(ACU)", T(5))
        for width, one_line in ((1280, True), (800, False), (390, False)):
            shot(drv, f"status-page-{width}.png", width, 900)
            problems = layout_problems(drv, one_line)
            assert not problems, f"at {width} px:\n" + "\n".join(problems)

        # amounts: written out, four significant digits in ACU
        def amounts():
            return fresh(lambda: [e.text for e in drv.find_elements(
                By.CSS_SELECTOR, "#cost, #idle-cost, #costs-fleet td.num, #costs-models td.num")])
        page = fresh(lambda: drv.find_element(By.TAG_NAME, "main").text)
        assert not re.search(r"\d[eE][-+]?\d", page), page
        money = [t for t in amounts() if re.fullmatch(r"[\d,.]+", t) and t != "0" and "." in t]
        assert money, amounts()
        assert all(sig_digits(t) == 4 for t in money), money
        assert text(drv, "cost") == "1.330", text(drv, "cost")
        # another currency: to the cent
        rewrite_config(d, lambda c: c.__setitem__("costs", {"currency": "EUR"}))
        assert a.post("/admin/v1/reload").status_code == 200
        assert wait_until(lambda: text(drv, "costs-currency") == "(EUR)", T(10))
        assert wait_until(lambda: text(drv, "cost") == "1.33", T(5)), text(drv, "cost")
        cents = [t for t in amounts() if t not in ("–", "0")]
        assert cents and all(re.fullmatch(r"(< 0\.01|[\d,]+\.\d\d)( \(\d+ %\))?", t) for t in cents), cents
        problems = layout_problems(drv, False)
        assert not problems, "\n".join(problems)
        assert not console_errors(drv)
    finally:
        for c in conns:
            c.close()
