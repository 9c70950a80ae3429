"""A stand-in for the Acurast processor's bridge socket and tunnel relay, for
test_tunnel.py, test_acurast_kit.py and deploy/acurast/rehearse.sh (run as a program:
`python3 acubridge.py DIR` prints {"socket": NAME, "ca": PEM} on one line once it listens,
and serves until it is sent SIGTERM or SIGINT). It follows the Acurast processor's documented bridge protocol (see
docs/agent.md on the tunnel): an abstract Unix socket (the name goes in BRIDGE_SOCKET), one JSON-RPC
2.0 request line and one answer line per connection; tunnel_start's spec
{serverAddrs, domainSuffix, localAddr, primaryKey {algorithm, bytes}} answered with
{url, clientId}; tunnel_status {status}; tunnel_stop {}.

So that the URL is both the protocol's shape and routable on a test machine, the double
also plays the relay: each tunnel it opens is a TLS listener on 127.0.0.1 (a certificate
for "<clientId>.<domainSuffix>" signed by the double's own CA) that forwards every
connection to localAddr, and the URL it answers is https://<clientId>.<domainSuffix>:<port>.
Tests pass --tunnel-domain localhost: names under .localhost are loopback (RFC 6761), and
libcurl resolves them so without DNS; the gateway trusts the double's CA
(upstream.ca_file). As on the real network the clientId is derived from the key
(sha256 of primaryKey.bytes), so a kept key keeps it; each tunnel_start opens a new
relay listener, so a reopened tunnel gets a new port and so a new URL (B after A).

Scriptable: `status` is what tunnel_status reports; `fail()` makes it report 3 (failed)
and closes the open relay, as a dead tunnel would; `script` is a list of answers for the
next tunnel_start calls (a str is sent as the raw answer line, a dict as the JSON-RPC
answer); `trickle` sends every answer under 4 KiB one byte at a time; `calls` records every
(method, params)."""

import datetime
import hashlib
import json
import os
import socket
import ssl
import threading
import time
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

MAX_LINE = 1 << 20


class _CA:
    def __init__(self, folder):
        self.folder = Path(folder)
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "acubridge test CA")])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(hours=1))
                     .not_valid_after(now + datetime.timedelta(days=2))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.pem = self.folder / "acubridge-ca.pem"
        self.pem.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def context_for(self, host, tag):
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
                .issuer_name(self.cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=2))
                .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
                .sign(self.key, hashes.SHA256()))
        cf, kf = self.folder / f"relay-{tag}.pem", self.folder / f"relay-{tag}.key"
        cf.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        kf.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()))
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cf, kf)
        return ctx


class _Relay:
    """One open tunnel: TLS on 127.0.0.1:port, forwarded to local (HOST, PORT)."""

    def __init__(self, ctx, local):
        self.ctx, self.local = ctx, local
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        self.lock = threading.Lock()
        self.closed = False
        self.served = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        try:
            c.settimeout(10)
            t = self.ctx.wrap_socket(c, server_side=True)
            t.settimeout(None)
            up = socket.create_connection(self.local, timeout=5)
            up.settimeout(None)
        except (OSError, ssl.SSLError):
            c.close()
            return
        with self.lock:
            if self.closed:
                t.close()
                up.close()
                return
            self.conns += [t, up]
            self.served += 1
        threading.Thread(target=self._pump, args=(up, t), daemon=True).start()
        self._pump(t, up)

    @staticmethod
    def _shut(s):
        """Wake whatever thread reads or writes s, and close nothing: the TLS socket's
        OpenSSL object keeps its descriptor's number, so a thread still in its read or write
        after a close() from another thread goes on with whatever socket of this process
        takes the number next -- a test's own client connection to the gateway, whose
        answer it then ate and into which it wrote TLS records (the gateway answered 400;
        a CI run read the tail of a 200 body and that 400 as the answer). The base class's
        shutdown leaves the TLS object alone (SSLSocket.shutdown drops it under the other
        thread); each socket is closed when the threads using it are done with it."""
        try:
            socket.socket.shutdown(s, socket.SHUT_RDWR)
        except OSError:
            pass

    @staticmethod
    def _pump(a, b):
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                b.sendall(d)
        except (OSError, ssl.SSLError, ValueError):
            pass
        for s in (a, b):
            _Relay._shut(s)

    def close(self):
        with self.lock:
            self.closed = True
            conns, self.conns = self.conns, []
        self.sock.close()  # (a plain socket: a thread in its accept() keeps the old one)
        for s in conns:
            self._shut(s)


class FakeBridge:
    def __init__(self, folder):
        self.name = f"fleetgate-test-bridge-{os.getpid()}-{os.urandom(4).hex()}"
        self.ca = _CA(folder)
        self.ca_file = str(self.ca.pem)
        self.calls = []
        self.script = []
        self.status = 1
        self.trickle = False
        self.relays = []
        self.urls = []
        self.lock = threading.Lock()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind("\0" + self.name)
        self.sock.listen(16)
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    # -- scripting --------------------------------------------------------------------
    def fail(self):
        """The tunnel dies: status 3, and its relay stops forwarding."""
        with self.lock:
            self.status = 3
            relays = list(self.relays)
        for r in relays:
            r.close()

    def methods(self):
        with self.lock:
            return [m for m, _ in self.calls]

    def starts(self):
        with self.lock:
            return [p for m, p in self.calls if m == "tunnel_start"]

    # -- the protocol -----------------------------------------------------------------
    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        with c:
            c.settimeout(5)
            buf = b""
            try:
                while b"\n" not in buf and len(buf) < MAX_LINE:
                    d = c.recv(65536)
                    if not d:
                        break
                    buf += d
                req = json.loads(buf.split(b"\n", 1)[0])
            except (OSError, ValueError):
                return
            answer = self._answer(req)
            data = answer.encode() if isinstance(answer, str) else answer
            try:
                if self.trickle and len(data) < 4096:  # (a long one would pass the deadline)
                    for i in range(len(data)):
                        c.sendall(data[i:i + 1])
                        time.sleep(0.0005)
                else:
                    c.sendall(data)
            except OSError:
                pass

    def _answer(self, req):
        method, params, rid = req.get("method"), req.get("params"), req.get("id")
        with self.lock:
            self.calls.append((method, params))
        assert req.get("jsonrpc") == "2.0"

        def ok(result):
            return json.dumps({"jsonrpc": "2.0", "result": result, "id": rid}) + "\n"

        if method == "tunnel_status":
            with self.lock:
                return ok({"status": self.status})
        if method == "tunnel_stop":
            with self.lock:
                self.status = 2
            return ok({})
        if method != "tunnel_start":
            return json.dumps({"jsonrpc": "2.0", "error": {"code": -32601, "message": "no such method"},
                               "id": rid}) + "\n"
        with self.lock:
            scripted = self.script.pop(0) if self.script else None
        if isinstance(scripted, str):
            return scripted
        if isinstance(scripted, dict):
            return json.dumps(dict(scripted, jsonrpc="2.0", id=rid)) + "\n"
        spec = params[0]
        key = (spec.get("primaryKey") or {}).get("bytes", "")
        cid = hashlib.sha256(key.encode()).hexdigest()[:20]
        host = f"{cid}.{spec['domainSuffix']}"
        h, _, p = spec["localAddr"].rpartition(":")
        relay = _Relay(self.ca.context_for(host, len(self.urls)), (h, int(p)))
        url = f"https://{host}:{relay.port}"
        with self.lock:
            old, self.relays = self.relays, [relay]
            self.urls.append(url)
            self.status = 1
        for r in old:
            r.close()
        return ok({"url": url, "clientId": cid})

    def close(self):
        self.sock.close()
        with self.lock:
            relays, self.relays = self.relays, []
        for r in relays:
            r.close()


def main(argv):
    """The double as a process of its own (deploy/acurast/rehearse.sh): the CA goes into
    argv[1]; the socket's name and the CA's path are printed as one JSON line."""
    import signal
    import sys
    if len(argv) != 2 or not Path(argv[1]).is_dir():
        sys.stderr.write("usage: acubridge.py DIR (a folder for the CA and the relays' certificates)\n")
        return 2
    bridge = FakeBridge(argv[1])
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    print(json.dumps({"socket": bridge.name, "ca": bridge.ca_file}), flush=True)
    while not done.wait(1):
        pass
    bridge.close()
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main(sys.argv))
