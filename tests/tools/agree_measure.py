#!/usr/bin/python3
"""How far two llama-servers running one GGUF with different thread counts agree on the same
prompts at temperature 0 with a seed (issue #32: the rule that says two phones agree).

Starts the engine of a release twice (-t A and -t B), asks each the same chat prompts one at
a time and then several at once (slots batched together), and prints, per prompt, whether the
whole texts are equal and how many leading tokens (the answer's pieces as the engine counts
them, via logprobs) agree. Usage:
  agree_measure.py ENGINE_DIR MODEL_FILE [--threads 1,2] [--prompts 40] [--max-tokens 48]
"""
import argparse
import concurrent.futures as cf
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import requests

WORDS = ("card transaction merchant refund chargeback account login device address shipping "
         "velocity amount currency country email phone billing review risk flag customer order "
         "payment declined approved manual bank issuer fraud score level history").split()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def prompts(n):
    out = []
    for i in range(n):
        w = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(8 + i % 13)]
        out.append(f"Review {i}: " + " ".join(w) + ". Answer with RISK_LEVEL: 1-5 and one reason.")
    return out


def start(binary, model, threads, slots, folder):
    port = free_port()
    log = open(os.path.join(folder, f"engine-{threads}-{port}.log"), "w")
    p = subprocess.Popen([binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-np",
                          str(slots), "-c", str(slots * 2048), "-t", str(threads), "--jinja",
                          "--alias", "m"], stdout=log, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if requests.get(url + "/health", timeout=1).status_code == 200:
                return p, url
        except requests.RequestException:
            pass
        time.sleep(0.1)
    p.kill()
    raise SystemExit(f"engine on {port} did not start")


def ask(url, prompt, max_tokens):
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "seed": 42, "max_tokens": max_tokens, "logprobs": True, "top_logprobs": 2}
    r = requests.post(url + "/v1/chat/completions", json=body, timeout=300)
    r.raise_for_status()
    c = r.json()["choices"][0]
    msg = c["message"]
    text = (msg.get("reasoning_content") or "") + (msg.get("content") or "")
    toks = [t["token"] for t in ((c.get("logprobs") or {}).get("content") or [])]
    return text, toks


def lead(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("engine_dir")
    ap.add_argument("model_file")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=48)
    a = ap.parse_args()
    ta, tb = (int(x) for x in a.threads.split(","))
    folder = tempfile.mkdtemp(prefix="agree-")
    binary = os.path.join(folder, "llama-server")
    shutil.copyfile(os.path.join(a.engine_dir, "llama-server"), binary)
    os.chmod(binary, 0o755)
    model = os.path.join(a.engine_dir, a.model_file)
    procs = []
    try:
        pa, ua = start(binary, model, ta, 2, folder)
        procs.append(pa)
        pb, ub = start(binary, model, tb, 2, folder)
        procs.append(pb)
        ps = prompts(a.prompts)
        res = {"one_at_a_time": [], "two_at_once": []}
        for p in ps:
            res["one_at_a_time"].append((ask(ua, p, a.max_tokens), ask(ub, p, a.max_tokens)))
        # the same prompts two at once on each engine: its slots decode in one batch
        with cf.ThreadPoolExecutor(4) as ex:
            for i in range(0, len(ps), 2):
                pair = ps[i:i + 2]
                fa = [ex.submit(ask, ua, p, a.max_tokens) for p in pair]
                fb = [ex.submit(ask, ub, p, a.max_tokens) for p in pair]
                for x, y in zip(fa, fb):
                    res["two_at_once"].append((x.result(), y.result()))
        summary = {}
        for mode, rows in res.items():
            equal = sum(1 for (x, y) in rows if x[0] == y[0])
            leads = sorted(lead(x[1], y[1]) for (x, y) in rows)
            first_line = sum(1 for (x, y) in rows
                             if " ".join(x[0].strip().split("\n")[0].split()) ==
                             " ".join(y[0].strip().split("\n")[0].split()))
            summary[mode] = {"prompts": len(rows), "texts_equal": equal,
                             "first_line_equal": first_line,
                             "min_leading_tokens_equal": leads[0] if leads else 0,
                             "tokens_per_answer": max(len(x[1]) for (x, _) in rows)}
        print(json.dumps({"engine": a.engine_dir, "threads": [ta, tb], **summary}, indent=1))
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
