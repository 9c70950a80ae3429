"""The front door: HTTPS (versions, ALPN, certificate reload), API keys and their limits,
the openai npm client's own retry against our 429s, and fair shares between callers."""
import concurrent.futures
import hashlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest
import requests

import fleet
import gwutil as g
from fleet import T

HOST = "127.0.0.1"
NODE_DIR = fleet.NODE_DIR
KEY_A, KEY_B = "sk-team-a-0123456789", "sk-team-b-9876543210"


def sha(key):
    return hashlib.sha256(key.encode()).hexdigest()


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    """A test CA and two server certificates it signed (localhost, 127.0.0.1)."""
    d = tmp_path_factory.mktemp("tls")
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=fleetgate test CA",
            cwd=d)
    for name in ("one", "two"):
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", "/CN=localhost", cwd=d)
        (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", "san.ext",
                cwd=d)
    return d


def start(gateway, sim, tls_dir, keys=None, phones=1, slots=1, decode_tps=20, models=None, **kw):
    """Phones, then a gateway with a plain listener (ports[0], for readiness) and a TLS
    one (ports[1]) whose certificate files live in the test's own folder (so a test may
    replace them)."""
    ps = [g.phone(sim, f"p{i}", slots=slots, decode_tps=decode_tps) for i in range(phones)]
    reps = [g.replica(p, models=models) for p in ps]
    work = Path(tls_dir).parent / f"live-{time.monotonic_ns()}"
    work.mkdir()
    shutil.copy(tls_dir / "one.pem", work / "cert.pem")
    shutil.copy(tls_dir / "one.key", work / "key.pem")

    def config(ports):
        cfg = g.gw_config(ports[0], reps, **kw)
        cfg["listen"].append({"address": f"{HOST}:{ports[1]}",
                              "tls": {"cert": str(work / "cert.pem"), "key": str(work / "key.pem")}})
        if keys is not None:
            cfg["api_keys"] = keys
        return cfg

    gw = gateway(config, n_ports=2, ready=lambda d: (g.replicas_ready(d) or 0) >= len(reps))
    gw.tls_port = gw.ports[1]
    gw.tls_url = f"https://localhost:{gw.tls_port}"
    gw.cert_dir = work
    return gw, ps


def body(content="hello", max_tokens=4, **kw):
    b = fleet.chat_body(content, model=g.MODEL, max_tokens=max_tokens)
    b.update(kw)
    return b


# ---------------------------------------------------------------------------- HTTPS

def test_session_ticket_keys_rotate_on_a_timer(sim, gateway, tls):
    """A TLS session resumes by its ticket; once the ticket key has been replaced twice
    (tls_ticket_rotate_s, 1 s here) the old ticket no longer opens and the client gets a
    full handshake (and a new ticket that resumes again)."""
    gw, _ = start(gateway, sim, tls, tls_ticket_rotate_s=1)
    ctx = ssl.create_default_context(cafile=str(tls / "ca.pem"))
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2  # the ticket comes within the handshake

    def connect(session=None):
        with socket.create_connection((HOST, gw.tls_port), timeout=T(5)) as raw:
            with ctx.wrap_socket(raw, server_hostname="localhost", session=session) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                data = b""
                while True:
                    b = s.recv(4096)
                    if not b:
                        break
                    data += b
                assert data.startswith(b"HTTP/1.1 200"), data[:100]
                return s.session, s.session_reused

    def rotated():
        return [r for r in g.log_records(gw) if r.get("msg", "").startswith("TLS session ticket key rotated")]

    sess, reused = connect()
    assert not reused
    before = len(rotated())
    _, reused = connect(sess)
    assert reused, "a fresh ticket did not resume"
    assert fleet.wait_until(lambda: len(rotated()) >= before + 2, T(10)), rotated()
    fresh, reused = connect(sess)
    assert not reused, "a ticket two keys old still resumed"
    _, reused = connect(fresh)
    assert reused or len(rotated()) >= before + 4, "the new ticket did not resume"


def test_https_answers_and_refuses_old_tls(sim, gateway, tls):
    gw, _ = start(gateway, sim, tls)
    ca = str(tls / "ca.pem")
    # curl --cacert, as the README shows
    p = subprocess.run(["curl", "-sS", "--cacert", ca, f"{gw.tls_url}/v1/chat/completions",
                        "-H", "Content-Type: application/json", "-d", json.dumps(body())],
                       capture_output=True, text=True, timeout=T(30))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["object"] == "chat.completion"
    # Python with the test CA, whole and streamed
    r = requests.post(f"{gw.tls_url}/v1/chat/completions", json=body(), verify=ca, timeout=T(20))
    assert r.status_code == 200 and r.headers["x-fleetgate-replica"] == "p0"
    r = requests.post(f"{gw.tls_url}/v1/chat/completions", json=body(stream=True), verify=ca,
                      timeout=T(20), stream=True)
    events = [ln for ln in r.iter_lines() if ln.startswith(b"data: ")]
    assert events[-1] == b"data: [DONE]" and len(events) >= 4
    # ALPN picks http/1.1; TLS 1.3 by default
    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    with socket.create_connection((HOST, gw.tls_port), timeout=T(5)) as s:
        with ctx.wrap_socket(s, server_hostname="localhost") as t:
            assert t.selected_alpn_protocol() == "http/1.1"
            assert t.version() == "TLSv1.3"
    # TLS 1.0 and 1.1 handshakes are refused (openssl s_client, since Python's own
    # OpenSSL may not even offer them)
    for flag in ("-tls1", "-tls1_1"):
        p = subprocess.run(["openssl", "s_client", "-connect", f"{HOST}:{gw.tls_port}", flag,
                            "-CAfile", ca], input="", capture_output=True, text=True, timeout=T(20))
        assert p.returncode != 0 and "Cipher is (NONE)" in p.stdout + p.stderr or \
            "no protocols available" in p.stderr or "alert" in p.stderr, (flag, p.stdout, p.stderr)
    # TLS 1.2 with a strong cipher works
    p = subprocess.run(["openssl", "s_client", "-connect", f"{HOST}:{gw.tls_port}", "-tls1_2",
                        "-CAfile", ca], input="", capture_output=True, text=True, timeout=T(20))
    assert "ECDHE" in p.stdout and "Verify return code: 0 (ok)" in p.stdout, p.stdout[-800:]


def peer_cert(port, ca):
    ctx = ssl.create_default_context(cafile=ca)
    with socket.create_connection((HOST, port), timeout=T(5)) as s:
        with ctx.wrap_socket(s, server_hostname="localhost") as t:
            return t.getpeercert(binary_form=True)


def test_certificate_reload_keeps_connections(sim, gateway, tls):
    gw, _ = start(gateway, sim, tls)
    ca = str(tls / "ca.pem")
    der_one = ssl.PEM_cert_to_DER_cert((tls / "one.pem").read_text())
    der_two = ssl.PEM_cert_to_DER_cert((tls / "two.pem").read_text())
    assert peer_cert(gw.tls_port, ca) == der_one
    sess = requests.Session()
    assert sess.post(f"{gw.tls_url}/v1/chat/completions", json=body(), verify=ca,
                     timeout=T(20)).status_code == 200
    # renewed certificate files, then SIGHUP
    shutil.copy(tls / "two.pem", gw.cert_dir / "cert.pem")
    shutil.copy(tls / "two.key", gw.cert_dir / "key.pem")
    gw.send_signal(__import__("signal").SIGHUP)
    fleet.wait_until(lambda: peer_cert(gw.tls_port, ca) == der_two, T(5), what="new certificate")
    # the connection opened before the reload still serves
    r = sess.post(f"{gw.tls_url}/v1/chat/completions", json=body(), verify=ca, timeout=T(20))
    assert r.status_code == 200
    assert len(g.log_msgs(gw, "configuration reloaded")) >= 1


def test_bad_certificate_refuses_the_reload(sim, gateway, tls):
    gw, _ = start(gateway, sim, tls)
    ca = str(tls / "ca.pem")
    (gw.cert_dir / "key.pem").write_text("not a key\n")
    gw.send_signal(__import__("signal").SIGHUP)
    fleet.wait_until(lambda: g.log_msgs(gw, "configuration reload refused; the running "
                                            "configuration is unchanged"), T(5), what="refusal")
    r = requests.post(f"{gw.tls_url}/v1/chat/completions", json=body(), verify=ca, timeout=T(20))
    assert r.status_code == 200


# ---------------------------------------------------------------------------- API keys

def test_key_errors_and_limits(sim, gateway, tls):
    keys = [{"name": "team-a", "key_sha256": sha(KEY_A), "rpm": 30, "models": [g.MODEL]},
            {"name": "team-b", "key_sha256": sha(KEY_B), "priority": "batch", "tpm": 600}]
    gw, _ = start(gateway, sim, tls, keys=keys, decode_tps=100, models=[g.MODEL, "other-model"])
    url = gw.url + "/v1/chat/completions"

    def post(key=None, hdr="authorization", extra=None, **kw):
        h = dict(extra or {})
        if key:
            h[hdr] = f"Bearer {key}" if hdr == "authorization" else key
        return requests.post(url, json=body(**kw), headers=h, timeout=T(20))

    g.check_error(post(), 401, "invalid_api_key")
    g.check_error(post("sk-wrong"), 401, "invalid_api_key")
    g.check_error(requests.get(gw.url + "/v1/models", timeout=T(5)), 401, "invalid_api_key")
    assert requests.get(gw.url + "/v1/models", headers={"x-api-key": KEY_A},
                        timeout=T(5)).status_code == 200
    assert post(KEY_A, hdr="x-api-key").status_code == 200
    g.check_error(post(KEY_A, model="other-model"), 403, "model_not_allowed")
    g.check_error(post(KEY_B, extra={"x-fleetgate-priority": "interactive"}), 403,
                  "priority_not_allowed")
    # requests per minute: 30 in the bucket (one used above), then 429 with a Retry-After
    # of about 60/30 = 2 s, after which the key is served again
    codes = [post(KEY_A, max_tokens=1).status_code for _ in range(29)]
    assert codes == [200] * 29, codes
    r = post(KEY_A, max_tokens=1)
    g.check_error(r, 429, "rate_limit_exceeded", retry_after=True)
    ra = int(r.headers["Retry-After"])
    assert 1 <= ra <= 3, ra
    time.sleep(ra + 0.2)
    assert post(KEY_A, max_tokens=1).status_code == 200
    # tokens per minute, counted from usage: one big answer puts the key in debt
    r = post(KEY_B, content="x" * 2400, max_tokens=40)
    assert r.status_code == 200, r.text
    used = r.json()["usage"]["total_tokens"]
    assert used > 600 / 60 * 2
    r = post(KEY_B)
    g.check_error(r, 429, "rate_limit_exceeded", retry_after=True)
    ra = int(r.headers["Retry-After"])
    assert 1 <= ra <= 70, ra
    # the access log names the key, never the key itself
    logs = gw.logs(tail=10 ** 7)
    assert '"key":"team-a"' in logs and '"key":"team-b"' in logs
    for secret in (KEY_A, KEY_B, sha(KEY_A)):
        assert secret not in logs


def test_concurrency_limit_and_openai_client_retry_over_https(sim, gateway, tls):
    fleet.need_node_openai()
    keys = [{"name": "solo", "key_sha256": sha(KEY_A), "concurrency": 1}]
    gw, _ = start(gateway, sim, tls, keys=keys, decode_tps=4)  # 40 tokens/s
    # direct: the second concurrent request gets 429 with Retry-After: 1
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        f1 = ex.submit(requests.post, gw.url + "/v1/chat/completions",
                       json=body(max_tokens=60), headers={"x-api-key": KEY_A}, timeout=T(20))
        time.sleep(0.3)
        r2 = requests.post(gw.url + "/v1/chat/completions", json=body(),
                           headers={"x-api-key": KEY_A}, timeout=T(20))
        assert f1.result().status_code == 200
    g.check_error(r2, 429, "rate_limit_exceeded", retry_after=True)
    assert r2.headers["Retry-After"] == "1"
    # the official client over HTTPS retries that 429 by itself and succeeds
    env = dict(os.environ, NODE_EXTRA_CA_CERTS=str(tls / "ca.pem"))
    p = subprocess.run(["node", "keys.mjs", gw.tls_url + "/v1", g.MODEL, KEY_A], cwd=NODE_DIR,
                       env=env, capture_output=True, text=True, timeout=T(90))
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["ok"], out
    assert out["whole"]["content"] and out["whole"]["replica"] == "p0"
    assert out["retried"]["ok"] and out["retried"]["waited_ms"] >= 500, out


def test_hash_key_command():
    p = subprocess.run([fleet.gateway_bin(), "--hash-key"], input=KEY_A + "\n",
                       capture_output=True, text=True, timeout=10)
    assert p.returncode == 0
    assert p.stdout.strip() == f'"key_sha256": "{sha(KEY_A)}"'
    assert KEY_A not in p.stdout + p.stderr


# ---------------------------------------------------------------------------- fair shares

def flood(gw, keys_and_counts, max_tokens=2):
    """Queue every caller's burst at once (first caller first) and wait for all."""
    jobs = []
    with concurrent.futures.ThreadPoolExecutor(sum(n for _, n in keys_and_counts)) as ex:
        for key, n in keys_and_counts:
            for i in range(n):
                jobs.append(ex.submit(requests.post, gw.url + "/v1/chat/completions",
                                      json=body(f"{key} {i}", max_tokens=max_tokens),
                                      headers={"x-api-key": key}, timeout=T(120)))
            time.sleep(0.3)  # the first caller's whole burst is queued before the next
        return [f.result().status_code for f in jobs]


def served_order(gw):
    return [r["key"] for r in g.log_msgs(gw, "request") if r.get("status") == 200]


def test_equal_callers_get_equal_shares(sim, gateway, tls):
    keys = [{"name": "a", "key_sha256": sha(KEY_A)}, {"name": "b", "key_sha256": sha(KEY_B)}]
    gw, _ = start(gateway, sim, tls, keys=keys, decode_tps=2)
    codes = flood(gw, [(KEY_A, 40), (KEY_B, 40)])
    assert codes == [200] * 80
    order = served_order(gw)
    # while both had work queued, each got half of the phone: look at the 40 answers
    # after b's burst arrived (a's first few ran alone)
    first_b = order.index("b")
    window = order[first_b:first_b + 40]
    assert len(window) == 40
    share_a = window.count("a") / 40
    assert 0.45 <= share_a <= 0.55, f"a got {share_a:.0%} of the phone: {''.join(window)}"


def test_weights_and_classes(sim, gateway, tls):
    keys = [{"name": "a", "key_sha256": sha(KEY_A), "weight": 3},
            {"name": "b", "key_sha256": sha(KEY_B), "weight": 1}]
    gw, _ = start(gateway, sim, tls, keys=keys, decode_tps=2)
    assert flood(gw, [(KEY_B, 30), (KEY_A, 30)]) == [200] * 60
    order = served_order(gw)
    first_a = order.index("a")
    window = order[first_a:first_a + 28]
    share_a = window.count("a") / len(window)
    assert 0.65 <= share_a <= 0.85, f"weight 3 got {share_a:.0%}: {''.join(window)}"
