"""Callers against each other on one gateway (issue 33): what one API key can do to every
other key through the Batch API, each attack run against the real binaries beside the
legitimate path, which must keep working in the same test.

- Batch creation exhausting memory: 300 batches created at once, pipelined on many
  connections, on a 10 MiB file without a newline. Validations run batch.validations at a
  time and each holds at most batch.max_line_bytes and one read, so the gateway stays
  under 100 MB; every such batch fails `line_too_long` (never `internal_error: out of
  memory`); another key's batch completes meanwhile.
- Files without a quota: a key fills its file quota (count and bytes, parallel uploads,
  one too large for what is left, one of unknown length) and gets 403
  `file_quota_exceeded`; data_dir never holds more of its bytes than the quota; uploads
  per minute, batches not ended, batches being validated and lines waiting have quotas
  too (429 with Retry-After), and uploads and batch creations count against the key's
  rpm. The admin API shows each key's use against its quotas.
- After a restart every unfinished batch comes back: 1,124 two-line batches of one key
  and a 10,000-line batch of another, with a window of 64 running batches, all finish.
  Batches waiting beyond the window are cancelled from their key and from the admin API,
  their input files can then be deleted, and one that waits past its window expires.
- Files expire: uploads after batch.file_expires_s or their expires_after, output files
  after batch.output_expires_s, an input file only once its batches have ended.
- Batch validation does not tell a key limited to some models which other models exist.
"""

import hashlib
import json
import os
import threading
import time

import requests

import fleet
import gwutil as g
from fleet import HOST, T, wait_until
from gwutil import CHAT, MODEL, RawConn, chat, check_chat_ok, phone, replica
from test_admin import TOKEN, TOKEN_ENV, Admin
from test_batch import (TERMINAL, check_accounting, check_batch, check_error_line,
                        check_output_line, create_batch, create_ok, get_batch, jsonl, line,
                        multipart, raw_post, results, upload, upload_ok, wait_batch)


def key(name, **quota):
    """An api_keys entry: its key is "sk-NAME-…", its quota entries as given."""
    k = {"name": name, "key_sha256": hashlib.sha256(secret(name).encode()).hexdigest()}
    k.update(quota)
    return k


def secret(name):
    return f"sk-{name}-0123456789abcdef"


def auth(name):
    return {"Authorization": f"Bearer {secret(name)}"}


def start(gateway, data_dir, replicas, keys, batch=None, ready=None, env=None, **kw):
    """A gateway with API keys, a data_dir, an admin listener on ports[1]; d.admin."""
    data_dir.mkdir(parents=True, exist_ok=True)
    n = len(replicas) if ready is None else ready

    def config(ports):
        cfg = g.gw_config(ports[0], replicas, data_dir=str(data_dir),
                          batch=dict({"sync": False}, **(batch or {})), api_keys=keys, **kw)
        cfg["admin"] = {"listen": f"{HOST}:{ports[1]}", "token_env": TOKEN_ENV}
        return cfg

    e = {TOKEN_ENV: TOKEN}
    e.update(env or {})
    d = gateway(config, n_ports=2, env=e,
                ready=(lambda d: (g.replicas_ready(d) or 0) >= n) if n else None)
    d.admin = Admin(d)
    return d


def key_use(d, name):
    """GET /admin/v1/keys: the key's Batch API use against its quotas."""
    r = d.admin.get("/admin/v1/keys")
    assert r.status_code == 200, (r.status_code, r.text[:300])
    keys = {k["key"]: k for k in r.json()["keys"]}
    assert name in keys, sorted(keys)
    return keys[name]["batch"]


def proc_kib(pid, field):
    for ln in open(f"/proc/{pid}/status"):
        if ln.startswith(field + ":"):
            return int(ln.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def create_bytes(port, file_id, name):
    body = json.dumps({"input_file_id": file_id, "endpoint": CHAT,
                       "completion_window": "24h"}).encode()
    return g.request_bytes("POST", "/v1/batches", port, body=body, headers=auth(name))


def pipelined_creates(d, file_id, name, n, conns):
    """n batch creations pipelined over `conns` connections at once (each connection
    sends its share in one write); [(status, headers, body)] in order."""
    per = [n // conns + (1 if i < n % conns else 0) for i in range(conns)]
    socks = [RawConn(d.port, timeout=T(30)) for _ in range(conns)]
    out = []
    try:
        for c, k in zip(socks, per):
            c.send(create_bytes(d.port, file_id, name) * k)
        for c, k in zip(socks, per):
            for _ in range(k):
                status, hdrs, body = c.read_response(timeout=T(60))
                out.append((status, hdrs, body))
    finally:
        for c in socks:
            c.close()
    return out


def files_bytes(data_dir, ids=None):
    """Bytes on disk under data_dir/files of these file ids (None: every file) and of the
    uploads arriving."""
    total = 0
    for p in (data_dir / "files").iterdir():
        if ids is None or p.name in ids or p.name.startswith(".upload-"):
            try:
                total += p.stat().st_size
            except FileNotFoundError:
                pass
    return total


# ================================================================== 1. memory

def test_pipelined_batch_creates_on_a_newline_less_file_keep_the_gateway_small(sim, gateway, tmp_path):
    p = phone(sim, "mem-phone", slots=4, decode_tps=200)
    # the attacker's quotas let all 300 through: what bounds memory is the gateway's own
    # validation slots and line limit, not the key's quota
    keys = [key("attacker", batches=1000, validating=1000), key("honest")]
    # a sanitizer build keeps freed memory in quarantine; keep that small so the high-water
    # mark measures what the gateway holds
    asan = (os.environ.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=4").lstrip(":")
    d = start(gateway, tmp_path / "data", [replica(p)], keys, env={"ASAN_OPTIONS": asan})
    ten_mib = b'{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": "' + \
        b"A" * (10 << 20)
    f = upload_ok(d, ten_mib, filename="no-newline.jsonl", headers=auth("attacker"))
    rss0 = proc_kib(d.pid, "VmRSS")

    # the honest key's batch is there before the flood and must complete through it
    honest_ids = [f"h-{i}" for i in range(6)]
    fh = upload_ok(d, jsonl([line(c, f"honest {c}", max_tokens=4) for c in honest_ids]),
                   headers=auth("honest"))
    bh = create_ok(d, fh["id"], headers=auth("honest"))

    t0 = time.monotonic()
    got = pipelined_creates(d, f["id"], "attacker", 300, conns=30)
    print(f"300 pipelined creates answered in {time.monotonic() - t0:.2f} s")
    assert [s for s, _, _ in got] == [200] * 300, [(s, b[:200]) for s, _, b in got if s != 200][:3]
    ids = [json.loads(b)["id"] for _, _, b in got]
    assert len(set(ids)) == 300

    # every one of them fails at its first line, line_too_long, with no out-of-memory
    def all_ended():
        u = key_use(d, "attacker")
        return u["batches"]["used"] == 0 and u["validating"]["used"] == 0
    assert wait_until(all_ended, T(60)), key_use(d, "attacker")
    hwm = proc_kib(d.pid, "VmHWM")
    print(f"gateway RSS {rss0 / 1024:.1f} MB before, high-water {hwm / 1024:.1f} MB after 300 creates")
    for bid in ids[:: 10] + ids[-3:]:
        b = get_batch(d, bid, headers=auth("attacker"))
        check_batch(b, status="failed")
        codes = [(e["code"], e.get("line")) for e in b["errors"]["data"]]
        assert codes == [("line_too_long", 1)], codes
        assert "batch.max_line_bytes" in b["errors"]["data"][0]["message"], b["errors"]
    r = requests.get(d.url + "/v1/batches", params={"limit": 100}, headers=auth("attacker"), timeout=T(10))
    assert r.status_code == 200, r.text
    assert not [x for x in r.json()["data"] if "internal_error" in json.dumps(x["errors"])]

    # the gateway stayed small: 300 x (10 MiB + 2 MiB) of buffers would be 3.6 GB (under
    # valgrind the process is valgrind's, with its own shadow of every byte)
    assert hwm - rss0 < (192 if fleet.under_valgrind() else 64) * 1024, (rss0, hwm)
    if not os.environ.get("FLEETGATE_SANITIZER_PASS") and not fleet.under_valgrind():
        assert hwm < 100 * 1024, f"VmHWM {hwm} KiB"

    # the honest key's batch completed, and interactive requests are served
    bh = wait_batch(d, bh["id"], headers=auth("honest"), timeout=30)
    check_batch(bh, status="completed")
    out, err = results(d, bh, headers=auth("honest"))
    check_accounting(bh, out, err, honest_ids)
    check_chat_ok(chat(d, "still served", headers=auth("honest")))

    # a line longer than the limit in the middle of a file is named, at once
    big = jsonl([line("ok-1", "first"), line("big", "x" * (2 << 20)), line("ok-3", "third")])
    fb = upload_ok(d, big, filename="long-line.jsonl", headers=auth("honest"))
    b = wait_batch(d, create_ok(d, fb["id"], headers=auth("honest"))["id"], headers=auth("honest"))
    check_batch(b, status="failed")
    assert [(e["code"], e["line"]) for e in b["errors"]["data"]] == [("line_too_long", 2)], b["errors"]


# ================================================================== 2. quotas

def test_a_key_over_its_file_quota_is_refused_and_data_dir_stays_within_it(sim, gateway, tmp_path):
    p = phone(sim, "quota-phone", slots=2, decode_tps=200)
    quota_bytes = 1 << 20
    keys = [key("filler", files=3, file_bytes=quota_bytes, uploads_per_min=1000),
            key("honest")]
    data_dir = tmp_path / "data"
    d = start(gateway, data_dir, [replica(p)], keys)

    # eight parallel 300 KB uploads: at most three fit in 1 MiB (and in 3 files)
    row = json.dumps(line("r", "x" * 200)).encode() + b"\n"
    chunk = row * (300_000 // len(row))
    results_ = [None] * 8
    peak = [0]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], files_bytes(data_dir))  # only the filler's so far
            time.sleep(0.005)

    def put(i):
        results_[i] = upload(d, chunk, filename=f"fill-{i}.jsonl", headers=auth("filler"))

    w = threading.Thread(target=watch)
    w.start()
    threads = [threading.Thread(target=put, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(T(30))
    stop.set()
    w.join()
    ok = [r for r in results_ if r.status_code == 200]
    refused = [r for r in results_ if r.status_code != 200]
    print(f"parallel uploads: {len(ok)} stored, {len(refused)} refused; "
          f"data_dir/files held at most {peak[0]} bytes")
    assert 1 <= len(ok) <= 3, [(r.status_code, r.text[:100]) for r in results_]
    for r in refused:
        e = g.check_error(r, 403, code="file_quota_exceeded", what="an upload past the quota")
        assert e["type"] == "permission_error" and "filler" in e["message"], e
    assert peak[0] <= quota_bytes + 65536, peak[0]  # arriving uploads included (one read of slack)
    while len(ok) < 3:
        ok.append(upload(d, chunk, filename="fill-more.jsonl", headers=auth("filler")))
        assert ok[-1].status_code == 200, ok[-1].text
    ids = {r.json()["id"] for r in ok}

    # count: a fourth file, however small, is refused (from its headers: the body unread)
    status, _, text = raw_post(d, "/v1/files", *multipart({"purpose": "batch"}, file=("tiny.jsonl", b"{}\n")),
                               headers=auth("filler"))
    assert status == 403, (status, text[:300])
    assert "files: 3" in g.check_error_body(text, 403, code="file_quota_exceeded")["message"]
    # the admin API shows the key at its quota
    u = key_use(d, "filler")
    assert u["files"] == {"used": 3, "limit": 3}, u
    assert u["file_bytes"]["used"] == 3 * len(chunk) and u["file_bytes"]["limit"] == quota_bytes, u

    # bytes: with one file deleted (600 KB left), a 500 KB upload is too much for the rest
    victim = sorted(ids)[0]
    assert d.request("DELETE", f"/v1/files/{victim}", headers=auth("filler")).status_code == 200
    ids.discard(victim)
    big = row * (500_000 // len(row))
    status, _, text = raw_post(d, "/v1/files", *multipart({"purpose": "batch"}, file=("big.jsonl", big)),
                               headers=auth("filler"))
    assert status == 403, (status, text[:300])
    assert "file_bytes" in g.check_error_body(text, 403, code="file_quota_exceeded")["message"]
    # ... and so is one of unknown length (chunked): stopped as it passes, nothing kept
    body, ctype = multipart({"purpose": "batch"}, file=("chunked.jsonl", big))

    def chunks():
        for i in range(0, len(body), 32768):
            yield body[i:i + 32768]
    try:
        r = requests.post(d.url + "/v1/files", data=chunks(), timeout=T(20),
                          headers=dict(auth("filler"), **{"Content-Type": ctype}))
        g.check_error(r, 403, code="file_quota_exceeded", what="a chunked upload past the quota")
    except requests.ConnectionError:
        pass  # the gateway answered and closed while the body was still being sent
    assert wait_until(lambda: not list((data_dir / "files").glob(".upload-*")), T(5))
    assert files_bytes(data_dir, ids) <= quota_bytes
    # a small one fits again
    upload_ok(d, jsonl([line("s-1", "small")]), filename="small.jsonl", headers=auth("filler"))

    # the honest key is not touched by the filler's quota: it runs a batch
    fh = upload_ok(d, jsonl([line(f"h-{i}", f"honest {i}") for i in range(3)]), headers=auth("honest"))
    bh = wait_batch(d, create_ok(d, fh["id"], headers=auth("honest"))["id"], headers=auth("honest"))
    check_batch(bh, status="completed")
    u = key_use(d, "honest")
    assert u["files"]["used"] == 2 and u["files"]["limit"] == 10000, u  # its input and its output


def test_upload_rate_batch_quotas_and_rpm_apply_to_the_batch_api(sim, gateway, tmp_path):
    p = phone(sim, "rate-phone", slots=1, decode_tps=10)  # 100 real tokens/s: 0.3 s a line
    keys = [key("uploader", uploads_per_min=2),
            key("rpm2", rpm=2),
            key("many", batches=2),
            key("burst", validating=2),
            key("lines", lines=6),
            key("honest")]
    d = start(gateway, tmp_path / "data", [replica(p)], keys)
    small = jsonl([line("a", "a", max_tokens=30)])

    # uploads per minute: two, then 429 with Retry-After (the bucket refills in 30 s)
    for _ in range(2):
        upload_ok(d, small, headers=auth("uploader"))
    r = upload(d, small, headers=auth("uploader"))
    e = g.check_error(r, 429, code="rate_limit_exceeded", retry_after=True, what="third upload")
    assert "uploads per minute" in e["message"] and 25 <= int(r.headers["Retry-After"]) <= 30, \
        (e, r.headers)

    # rpm 2: an upload and a batch creation take both requests; the next creation waits
    f = upload_ok(d, small, headers=auth("rpm2"))
    create_ok(d, f["id"], headers=auth("rpm2"))
    r = create_batch(d, f["id"], headers=auth("rpm2"))
    e = g.check_error(r, 429, code="rate_limit_exceeded", retry_after=True, what="rpm on creation")
    assert "requests per minute" in e["message"], e
    g.check_error(upload(d, small, headers=auth("rpm2")), 429, code="rate_limit_exceeded",
                  retry_after=True, what="rpm on upload")

    # batches not ended: two, then 429; a cancel frees one
    slow = jsonl([line(f"s-{i}", f"slow {i}", max_tokens=30) for i in range(5)])
    fs = upload_ok(d, slow, headers=auth("many"))
    b1 = create_ok(d, fs["id"], headers=auth("many"))
    create_ok(d, fs["id"], headers=auth("many"))
    r = create_batch(d, fs["id"], headers=auth("many"))
    e = g.check_error(r, 429, code="batch_quota_exceeded", retry_after=True, what="third batch")
    assert "batches: 2" in e["message"] and e["type"] == "rate_limit_error", e
    assert d.post(f"/v1/batches/{b1['id']}/cancel", headers=auth("many")).status_code == 200
    wait_batch(d, b1["id"], headers=auth("many"))
    create_ok(d, fs["id"], headers=auth("many"))

    # batches being validated: pipelined creations on a file that takes a while to read
    rows = [line(f"v-{i}", f"validate {i} " + "x" * 150, max_tokens=1) for i in range(30000)]
    fv = upload_ok(d, jsonl(rows), headers=auth("burst"))
    got = pipelined_creates(d, fv["id"], "burst", 6, conns=1)
    statuses = [s for s, _, _ in got]
    assert statuses == [200, 200, 429, 429, 429, 429], statuses
    for s, h, body in got[2:]:
        e = g.check_error_body(body.decode(), 429, code="batch_quota_exceeded")
        assert "validating: 2" in e["message"] and int(h["retry-after"]) >= 1, (e, h)
    for _, _, body in got[:2]:
        bid = json.loads(body)["id"]
        assert d.post(f"/v1/batches/{bid}/cancel", headers=auth("burst")).status_code == 200

    # lines waiting: a 5-line batch runs; another of 3 would pass 6 and fails validation
    f5 = upload_ok(d, jsonl([line(f"l-{i}", f"lines {i}", max_tokens=30) for i in range(5)]),
                   headers=auth("lines"))
    b5 = create_ok(d, f5["id"], headers=auth("lines"))
    wait_batch(d, b5["id"], until={"in_progress"} | TERMINAL, headers=auth("lines"))
    f3 = upload_ok(d, jsonl([line(f"m-{i}", f"more {i}") for i in range(3)]), headers=auth("lines"))
    b3 = wait_batch(d, create_ok(d, f3["id"], headers=auth("lines"))["id"], headers=auth("lines"))
    check_batch(b3, status="failed")
    assert [e["code"] for e in b3["errors"]["data"]] == ["line_quota_exceeded"], b3["errors"]
    u = key_use(d, "lines")
    assert u["lines"]["limit"] == 6 and 1 <= u["lines"]["used"] <= 5, u

    # the honest key meanwhile: uploads, creates, completes; its quotas are the defaults
    fh = upload_ok(d, jsonl([line("h-1", "honest")]), headers=auth("honest"))
    bh = wait_batch(d, create_ok(d, fh["id"], headers=auth("honest"))["id"], headers=auth("honest"),
                    timeout=60)
    check_batch(bh, status="completed")
    u = key_use(d, "honest")
    assert u["batches"] == {"used": 0, "limit": 100}, u
    assert u["uploads_per_min"]["limit"] == 60 and 0 < u["uploads_per_min"]["used"] <= 1, u


# ================================================================== 3. a restart

def fast_fleet(sim, n=4, slots=8):
    """Sims that answer a one-token line in a few milliseconds."""
    return [phone(sim, f"fast-{i}", slots=slots, prefill_tps=20000, decode_tps=2000) for i in range(n)]


def all_batches(d, name):
    """Every batch of the key, newest first (GET /v1/batches, page by page)."""
    out, after = [], None
    for _ in range(100):
        params = {"limit": 100}
        if after:
            params["after"] = after
        r = requests.get(d.url + "/v1/batches", params=params, headers=auth(name), timeout=T(10))
        assert r.status_code == 200, r.text
        page = r.json()
        out += page["data"]
        if not page["has_more"]:
            return out
        after = page["last_id"]
    raise AssertionError("more than 10,000 batches")


def test_every_unfinished_batch_comes_back_after_a_restart(sim, gateway, tmp_path):
    """One key makes 1,124 two-line batches, another a 10,000-line one, on a gateway whose
    one phone is slow; it runs 64 batches at a time and is killed (SIGKILL) while nearly
    all of them wait. Restarted in front of a fast fleet, every batch finishes, each line
    answered exactly once, the big one among them."""
    slow = phone(sim, "slow-0", slots=1, prefill_tps=1, decode_tps=1)
    keys = [key("flood", batches=2000, validating=2000, uploads_per_min=0),
            key("big")]
    data_dir = tmp_path / "data"
    batch = {"max_running": 64, "max_lines": 10000}
    d = start(gateway, data_dir, [replica(slow)], keys, batch=batch)

    small = upload_ok(d, jsonl([line("one", "first", max_tokens=1), line("two", "second", max_tokens=1)]),
                      filename="two-lines.jsonl", headers=auth("flood"))
    big_ids = [f"big-{i:05d}" for i in range(10000)]
    fbig = upload_ok(d, jsonl([line(c, f"case {c}", max_tokens=1) for c in big_ids]),
                     filename="ten-thousand.jsonl", headers=auth("big"))
    t0 = time.monotonic()
    got = pipelined_creates(d, small["id"], "flood", 1124, conns=8)
    assert [s for s, _, _ in got] == [200] * 1124, [(s, b[:200]) for s, _, b in got if s != 200][:3]
    flood = [json.loads(b)["id"] for _, _, b in got]
    bbig = create_ok(d, fbig["id"], headers=auth("big"))
    print(f"1,124 + 1 batches created in {time.monotonic() - t0:.1f} s")
    # the big batch gets a run slot in its turn, ahead of most of the flood
    mid = wait_batch(d, bbig["id"], headers=auth("big"), timeout=30, until={"in_progress"} | TERMINAL)
    print(f"the big batch in progress {time.monotonic() - t0:.1f} s after the first creation")
    assert mid["status"] == "in_progress", mid
    u = key_use(d, "flood")
    print(f"before the kill: flood {u['batches']['used']} batches not ended "
          f"({u['batches_queued']} queued), big {mid['request_counts']['completed']} lines done")
    assert u["batches"]["used"] > 1024 and u["batches_queued"] > 1000, u
    d.send_signal(9)
    d.check_exit = False
    assert d.wait_exit(T(5)) is not None

    t1 = time.monotonic()
    d2 = start(gateway, data_dir, [replica(x) for x in fast_fleet(sim)], keys, batch=batch)

    def done():  # every one comes back: none is stuck, none was forgotten
        u = key_use(d2, "flood")
        b = get_batch(d2, bbig["id"], headers=auth("big"))
        return u["batches"]["used"] == 0 and b["status"] in TERMINAL
    assert wait_until(done, T(90), interval=0.5), \
        (key_use(d2, "flood"), get_batch(d2, bbig["id"], headers=auth("big")))
    print(f"after the restart, everything ended in {time.monotonic() - t1:.1f} s")
    listed = all_batches(d2, "flood")
    assert sorted(b["id"] for b in listed) == sorted(flood)
    for b in listed:
        assert b["status"] == "completed" and b["request_counts"] == {"total": 2, "completed": 2, "failed": 0}, b
    for bid in flood[:3] + flood[-3:]:
        b = get_batch(d2, bid, headers=auth("flood"))
        out, err = results(d2, b, headers=auth("flood"))
        check_accounting(b, out, err, ["one", "two"])
    b = get_batch(d2, bbig["id"], headers=auth("big"))
    check_batch(b, status="completed")
    out, err = results(d2, b, headers=auth("big"))
    check_accounting(b, out, err, big_ids)
    assert not err, err[:3]
    assert b["request_counts"] == {"total": 10000, "completed": 10000, "failed": 0}, b


def test_batches_waiting_beyond_the_window_cancel_delete_and_expire(sim, gateway, tmp_path):
    """Four running batches, and a restart with room for one (batch.max_running 1): the
    three waiting stay `in_progress` (the admin API says they wait for a run slot); one is
    cancelled by its key, one by the admin API (both with what ran before the restart in
    their files), after which their input files can be deleted; the last expires at the end
    of its window, waiting, with its unrun lines answered batch_expired, as does the one
    that held the slot."""
    p = phone(sim, "window-phone", slots=2, decode_tps=20)  # 200 real tokens/s
    keys = [key("owner")]
    data_dir = tmp_path / "data"
    window = {"completion_window_s": 10, "window": 1}
    d = start(gateway, data_dir, [replica(p)], keys, batch=window)
    h = auth("owner")
    names = ["runs", "by-key", "by-admin", "expires"]
    # lines of 0.2 s, one at a time: "runs" (60 lines) holds the one run slot past the window
    ids = {n: [f"{n}-{i}" for i in range(60 if n == "runs" else 12)] for n in names}
    files = {n: upload_ok(d, jsonl([line(c, f"{c} text", max_tokens=40) for c in ids[n]]),
                          filename=f"{n}.jsonl", headers=h) for n in names}
    b = {n: create_ok(d, files[n]["id"], headers=h) for n in names}
    for n in names:
        wait_batch(d, b[n]["id"], headers=h, until=lambda x: x["request_counts"]["completed"] >= 1
                   or x["status"] in TERMINAL)
    g.check_error(d.request("DELETE", f"/v1/files/{files['by-key']['id']}", headers=h), 409,
                  code="file_in_use", what="the input of a running batch")
    d.send_signal(15)
    assert d.wait_exit(T(10)) == 0

    d2 = start(gateway, data_dir, [replica(p)], keys, batch=dict(window, max_running=1))
    listed = d2.admin.get("/admin/v1/batches").json()["data"]
    queued = {x["id"]: x["queued"] for x in listed}
    assert sorted(queued.values(), key=str) == [None, "run_slot", "run_slot", "run_slot"], listed
    running = [n for n in names if queued[b[n]["id"]] is None]
    assert running == ["runs"], (running, queued)
    for n in ("by-key", "by-admin", "expires"):
        x = get_batch(d2, b[n]["id"], headers=h)
        assert x["status"] == "in_progress", x  # what OpenAI's clients know

    # cancel from the key, and from the admin API: they end at once, with what had run
    r = d2.post(f"/v1/batches/{b['by-key']['id']}/cancel", headers=h)
    assert r.status_code == 200, r.text
    check_batch(r.json(), status="cancelled")
    r = d2.admin.post(f"/admin/v1/batches/{b['by-admin']['id']}/cancel")
    assert r.status_code == 200, r.text
    check_batch(r.json(), status="cancelled")
    for n in ("by-key", "by-admin"):
        x = get_batch(d2, b[n]["id"], headers=h)
        check_batch(x, status="cancelled")
        out, err = results(d2, x, headers=h)
        check_accounting(x, out, err, ids[n], all_ran=False)
        assert 1 <= len(out) < len(ids[n]), x
        for y in out:
            check_output_line(y)
        # its input file can go now
        r = d2.request("DELETE", f"/v1/files/{files[n]['id']}", headers=h)
        assert r.status_code == 200 and r.json()["deleted"] is True, r.text
    # a second cancel, and one of a batch that has ended: 409, saying what it is
    e = g.check_error(d2.post(f"/v1/batches/{b['by-key']['id']}/cancel", headers=h), 409,
                      code="batch_not_cancellable", what="cancel a cancelled batch")
    assert "cancelled" in e["message"], e
    r = d2.admin.post(f"/admin/v1/batches/{b['by-admin']['id']}/cancel")
    assert r.status_code == 409 and "cancelled" in r.json()["error"]["message"], r.text

    # the last one waits past its window: it expires, its unrun lines answered
    x = wait_batch(d2, b["expires"]["id"], headers=h, timeout=40)
    check_batch(x, status="expired")
    out, err = results(d2, x, headers=h)
    check_accounting(x, out, err, ids["expires"])
    assert out and err and all(check_error_line(y) == "batch_expired" for y in err), (len(out), err[:2])
    # and so does the one in the window, through its run
    x = wait_batch(d2, b["runs"]["id"], headers=h, timeout=40)
    check_batch(x, status="expired")
    out, err = results(d2, x, headers=h)
    check_accounting(x, out, err, ids["runs"])
    assert key_use(d2, "owner")["batches"]["used"] == 0


# ================================================================== 4. files expire

def test_files_expire(sim, gateway, tmp_path):
    p = phone(sim, "expiry-phone", slots=1, decode_tps=20)
    keys = [key("owner")]
    data_dir = tmp_path / "data"
    d = start(gateway, data_dir, [replica(p)], keys,
              batch={"file_expires_s": 3, "output_expires_s": 2})
    h = auth("owner")
    plain = upload_ok(d, jsonl([line("p-1", "plain")]), filename="plain.jsonl", headers=h)
    assert plain["expires_at"] == plain["created_at"] + 3, plain
    r = upload(d, jsonl([line("k-1", "kept")]), filename="kept.jsonl", headers=h,
               form={"expires_after[anchor]": "created_at", "expires_after[seconds]": "3600"})
    kept = r.json()
    assert r.status_code == 200 and kept["expires_at"] == kept["created_at"] + 3600, r.text
    # a batch that runs past its input file's expiry keeps the file until it ends
    slow_ids = [f"s-{i}" for i in range(30)]  # 0.2 s each on one slot: 6 s
    fs = upload_ok(d, jsonl([line(c, f"slow {c}", max_tokens=40) for c in slow_ids]),
                   filename="slow.jsonl", headers=h)
    bs = create_ok(d, fs["id"], headers=h)
    # a quick batch: its output file expires 2 s after it ended
    fq = upload_ok(d, jsonl([line("q-1", "quick")]), filename="quick.jsonl", headers=h)
    bq = wait_batch(d, create_ok(d, fq["id"], headers=h)["id"], headers=h)
    check_batch(bq, status="completed")
    out_file = d.get(f"/v1/files/{bq['output_file_id']}", headers=h).json()
    assert abs(out_file["expires_at"] - (bq["completed_at"] + 2)) <= 1, (out_file, bq)

    def gone(fid):
        return d.get(f"/v1/files/{fid}", headers=h).status_code == 404 and \
            not (data_dir / "files" / fid).exists()
    assert wait_until(lambda: gone(bq["output_file_id"]), T(5)), out_file
    assert wait_until(lambda: gone(plain["id"]) and gone(fq["id"]), T(5)), plain
    g.check_error(d.get(f"/v1/files/{plain['id']}/content", headers=h), 404, what="an expired file")
    listed = [x["id"] for x in d.get("/v1/files", headers=h).json()["data"]]
    assert plain["id"] not in listed and kept["id"] in listed, listed
    # the running batch's input is past its expiry and still there
    x = get_batch(d, bs["id"], headers=h)
    assert x["status"] == "in_progress", x
    assert time.time() > fs["expires_at"] and d.get(f"/v1/files/{fs['id']}", headers=h).status_code == 200
    x = wait_batch(d, bs["id"], headers=h, timeout=40)
    check_batch(x, status="completed")
    assert wait_until(lambda: gone(fs["id"]), T(5)), "the input file outlived its batch's end"
    # what the key holds went down with them: kept, and the slow batch's output (not yet expired)
    u = key_use(d, "owner")
    assert u["files"]["used"] <= 2, u
    assert d.get(f"/v1/files/{kept['id']}", headers=h).status_code == 200


# ================================================================== 5. which models exist

def test_batch_validation_tells_a_restricted_key_nothing_of_other_models(sim, gateway, tmp_path):
    p = phone(sim, "shown-phone", slots=2, decode_tps=100)
    hidden = phone(sim, "hidden-phone", slots=1, decode_tps=100, model="hidden-model")
    keys = [key("narrow", models=[MODEL]), key("wide")]
    d = start(gateway, tmp_path / "data", [replica(p), replica(hidden)], keys)

    # the interactive path: the same 403 for a model that exists and one that does not
    answers = {}
    for m in ("hidden-model", "no-such-model"):
        r = chat(d, "hi", model=m, headers=auth("narrow"))
        answers[m] = g.check_error(r, 403, code="model_not_allowed", what=m)
    assert answers["hidden-model"]["message"].replace("hidden-model", "M") == \
        answers["no-such-model"]["message"].replace("no-such-model", "M"), answers

    # batch validation answers the same, line by line
    f = upload_ok(d, jsonl([line("a", "a"), line("b", "b", model="hidden-model"),
                            line("c", "c", model="no-such-model")]), headers=auth("narrow"))
    b = wait_batch(d, create_ok(d, f["id"], headers=auth("narrow"))["id"], headers=auth("narrow"))
    check_batch(b, status="failed")
    errs = {e["line"]: e for e in b["errors"]["data"]}
    assert sorted(errs) == [2, 3], errs
    assert errs[2]["code"] == errs[3]["code"] == "model_not_allowed", errs
    assert errs[2]["param"] == errs[3]["param"], errs
    norm = [errs[k]["message"].replace(f"line {k}", "line N").replace(m, "M")
            for k, m in ((2, "hidden-model"), (3, "no-such-model"))]
    assert norm[0] == norm[1], norm

    # a key without a list still learns what the fleet does not serve, and runs the rest
    f = upload_ok(d, jsonl([line("a", "a", model="hidden-model"), line("c", "c", model="no-such-model")]),
                  headers=auth("wide"))
    b = wait_batch(d, create_ok(d, f["id"], headers=auth("wide"))["id"], headers=auth("wide"))
    assert [(e["line"], e["code"]) for e in b["errors"]["data"]] == [(2, "model_not_found")], b["errors"]
    f = upload_ok(d, jsonl([line("a", "a"), line("b", "b")]), headers=auth("narrow"))
    b = wait_batch(d, create_ok(d, f["id"], headers=auth("narrow"))["id"], headers=auth("narrow"))
    check_batch(b, status="completed")
