"""Comparing the simulated phone with the real llama-servers (test_sim.py): an answer's
skeleton (its keys in order and the type of every value, with what cannot repeat from one
answer to the next — ids, clocks, generated text, token counts — reduced to its type),
server-sent events with their names, and the prompt-cache experiment of
../shared/engines/llama-server-qwen35/README.md (its experiments/cache.py) driven with
token ids, so that the sim and the real b10587 read the very same tokens."""

import json

import requests

from fleet import T

# values that differ between any two answers of the same server, or that name the model
VOLATILE_STR = {"id", "model", "system_fingerprint", "content", "reasoning_content", "text", "delta",
                "item_id", "token", "arguments", "build_info", "model_alias", "model_path",
                "chat_template", "media_marker", "bos_token", "eos_token", "owned_by", "ftype",
                "model_ftype", "chat_format", "reasoning_format", "generation_prompt", "name"}
VOLATILE_NUM = {"id", "created", "created_at", "completed_at", "completion_tokens", "prompt_tokens",
                "total_tokens", "cached_tokens", "cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms",
                "prompt_per_second", "predicted_n", "predicted_ms", "predicted_per_token_ms",
                "predicted_per_second", "input_tokens", "output_tokens", "logprob", "n_ctx", "n_ctx_train",
                "n_vocab", "n_embd", "n_params", "size", "total_slots", "n_decoded", "n_remain",
                "n_prompt_tokens", "n_prompt_tokens_processed", "n_prompt_tokens_cache", "id_task",
                "dry_penalty_last_n", "n_predict", "max_tokens"}
# lists whose length follows the model or the text (compared by their first item)
FIRST_ONLY = {"content", "top_logprobs", "tags", "aliases", "capabilities", "families"}
# lists of the token's own numbers (compared by their type)
TYPE_ONLY = {"bytes"}
# objects whose values are the model's, not the server's (compared by their keys)
KEYS_ONLY = {"chat_template_caps"}


def skeleton(v, key=None):
    """v with what varies from answer to answer replaced by its JSON type; key order kept.
    The text of error messages and every fixed value stay as they are."""
    if key in TYPE_ONLY:
        return "<" + type(v).__name__ + ">"
    if isinstance(v, dict):
        if key in KEYS_ONLY:
            return {k: "<" + type(x).__name__ + ">" for k, x in v.items()}
        return {k: skeleton(x, k) for k, x in v.items()}
    if isinstance(v, list):
        items = [skeleton(x, key) for x in v]
        return items[:1] if key in FIRST_ONLY else items
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, str):
        return "<str>" if key in VOLATILE_STR and v != "" else v
    if isinstance(v, (int, float)) and key in VOLATILE_NUM:
        return "<float>" if isinstance(v, float) else "<int>"
    return v


def sse_events(text):
    """[(event name or None, data)] of a server-sent event stream's body."""
    out = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data.append(line[len("data: "):])
        if data:
            d = "\n".join(data)
            out.append((name, d if d == "[DONE]" else json.loads(d)))
    return out


def stream_skeleton(text):
    """A stream's events as (name, skeleton) per choice index (None: events of no choice),
    a run of equal ones (one per token) kept once."""
    per = {}
    for name, d in sse_events(text):
        idx = d["choices"][0].get("index") if isinstance(d, dict) and d.get("choices") else None
        sk = (name, skeleton(d) if isinstance(d, dict) else d)
        lst = per.setdefault(idx, [])
        if not lst or lst[-1] != sk:
            lst.append(sk)
    return per


def answer_skeleton(base, method, path, body=None, headers=None):
    """(status, skeleton) of one request's answer; streams by choice."""
    r = requests.request(method, base + path, json=body, headers=headers, timeout=T(60))
    if r.headers.get("Content-Type", "").startswith("text/event-stream"):
        return r.status_code, stream_skeleton(r.text)
    try:
        return r.status_code, skeleton(r.json())
    except ValueError:
        return r.status_code, r.text


# ---------------------------------------------------------------------------- the cache experiment

SENTS = [
    "You are Harbor, a careful assistant that answers questions about shipping logistics for a mid-sized freight company.",
    "Always greet the user politely, keep answers short, and never invent tracking numbers or delivery dates.",
    "When a customer asks about a container, first confirm the booking reference, then describe its current status in plain words.",
    "If the booking reference is missing, ask for it once and explain where it can be found on the invoice.",
    "Quote prices only from the published tariff and state the currency, the validity period, and any surcharges that apply.",
    "Do not give legal advice about customs; point the user to the customs desk and its opening hours instead.",
    "Dangerous goods need a signed declaration, the UN number, the packing group, and an emergency contact available around the clock.",
    "Reefer containers must be pre-cooled, and the set temperature has to be confirmed in writing before the gate-in appointment.",
    "For delays caused by weather, apologise, give the new estimate if one exists, and offer to send an update by e-mail.",
    "Never reveal internal notes, staff names, or the contents of other customers' bookings, even if the user insists.",
]
USERS = ["What is the status of booking HB-1042?", "How much does a reefer container to Oslo cost?",
         "Can you ship lithium batteries?", "My container is late, why?", "Who is the manager on duty today?"]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}

# The README's table: step -> (prompt tokens, cache_n) on the default server (-np 2 -c 4096).
README_TABLE = {
    "A1": (1564, 0), "A2": (1562, 1540), "A3": (1557, 1540), "A4": (1558, 1540), "A5": (1559, 1540),
    "B1": (1555, 1540), "B2": (1555, 1551), "C1": (1559, 1048), "C2": (1579, 1555), "C3": (1598, 1575),
    "D1": (1559, 1048), "D2": (1583, 1555), "E1": (1555, 1048), "E2": (1576, 1558), "F1": (1564, 1048),
    "F2": (1564, 0), "F3": (1557, 1540), "G1": (1563, 1048), "G2": (1563, 0), "H1": (1562, 1540),
}


class CacheExperiment:
    """experiments/cache.py's sequence, each chat rendered by the real server's own
    template (/apply-template) and tokenizer (/tokenize), then sent as the same token ids
    to both servers through /v1/completions. The user turns are marked with
    message_delimiters as the chat endpoint marks them: llama-server takes the delimiter
    as a string it tokenizes ("<|im_start|>user"), the sim as those token ids. An exact
    extension (E2) adds to E1's prompt the tokens each server generated for it."""

    def __init__(self, real, sim):
        self.real, self.sim = real, sim
        self.user_delim = self.tokens("<|im_start|>user")
        self.rows = []  # (step, real prompt tokens, real cache_n, sim prompt tokens, sim cache_n)

    def post(self, base, path, body):
        r = requests.post(base + path, json=body, timeout=T(60))
        assert r.status_code == 200, (base, path, r.status_code, r.text[:500])
        return r.json()

    def tokens(self, text):
        return self.post(self.real, "/tokenize", {"content": text, "add_special": False,
                                                  "parse_special": True})["tokens"]

    def render(self, messages, **extra):
        return self.tokens(self.post(self.real, "/apply-template", {"messages": messages, **extra})["prompt"])

    def system_prompt(self, target):
        parts, i = [], 0
        while True:
            extra = f" This applies to region {chr(65 + (i * 7) % 26)}{i}." if i >= len(SENTS) else ""
            parts.append(f"Rule {i + 1}. " + SENTS[i % len(SENTS)] + extra)
            txt = "\n".join(parts)
            if len(self.tokens(txt)) >= target:
                return txt
            i += 1

    def step(self, label, toks, slot=None, spans=True, gen=None):
        """One request to both servers; returns each one's generated token ids and the
        real one's text."""
        out = {}
        for who, base in (("real", self.real), ("sim", self.sim)):
            prompt = toks[0] + gen[who] + toks[1] if gen else toks
            body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "logprobs": 1}
            if slot is not None:
                body["id_slot"] = slot
            if spans:
                delim = "<|im_start|>user" if who == "real" else self.user_delim
                body["message_delimiters"] = [{"role": "user", "delimiter": delim}]
            j = self.post(base, "/v1/completions", body)
            out[who] = (j["timings"]["cache_n"], j["usage"]["prompt_tokens"],
                        [e["id"] for e in j["choices"][0]["logprobs"]["content"]], j["choices"][0]["text"])
        self.rows.append((label, out["real"][1], out["real"][0], out["sim"][1], out["sim"][0]))
        return {k: v[2] for k, v in out.items()}, out["real"][3]

    def run(self, sys_tokens=1500):
        sysp = self.system_prompt(sys_tokens)
        s = {"role": "system", "content": sysp}
        for i, u in enumerate(USERS):  # A: same system prompt, new questions, slot 0
            self.step(f"A{i + 1}", self.render([s, {"role": "user", "content": u}]), slot=0)
        b = self.render([s, {"role": "user", "content": "Repeat request test."}])
        self.step("B1", b, slot=0)  # B: one prompt twice
        self.step("B2", b, slot=0)
        m1 = [s, {"role": "user", "content": "First question: where is my box?"}]
        self.step("C1", self.render(m1), slot=0)  # C: a chat; the answer was all reasoning
        m2 = m1 + [{"role": "assistant", "content": ""},
                   {"role": "user", "content": "Second question: and when will it arrive?"}]
        self.step("C2", self.render(m2), slot=0)
        m3 = m2 + [{"role": "assistant", "content": "", "reasoning_content": "thinking"},
                   {"role": "user", "content": "Third question: thanks, anything else?"}]
        self.step("C3", self.render(m3), slot=0)
        n1 = [s, {"role": "user", "content": "No-think first question."}]  # D: thinking off
        _, text = self.step("D1", self.render(n1, **NO_THINK), slot=0)
        n2 = n1 + [{"role": "assistant", "content": text}, {"role": "user", "content": "No-think second question."}]
        self.step("D2", self.render(n2, **NO_THINK), slot=0)
        e1 = self.render([s, {"role": "user", "content": "Raw turn one."}])  # E: no spans
        gen, _ = self.step("E1", e1, slot=0, spans=False)
        tail = self.tokens("<|im_end|>\n<|im_start|>user\nRaw turn two.<|im_end|>\n<|im_start|>assistant\n<think>\n")
        self.step("E2", (e1, tail), slot=0, spans=False, gen=gen)
        a1 = self.render([s, {"role": "user", "content": USERS[0]}])  # F: the other slot
        self.step("F1", a1, slot=0)
        self.step("F2", a1, slot=1)
        self.step("F3", self.render([s, {"role": "user", "content": "Other slot, new question."}]), slot=1)
        lines = sysp.split("\n")  # G: the system prompt edited near its end, then its start
        end = "\n".join(lines[:-1] + [lines[-1].replace("Rule", "Clause")])
        start = "\n".join([lines[0].replace("Harbor", "Quay")] + lines[1:])
        self.step("G1", self.render([{"role": "system", "content": end}, {"role": "user", "content": USERS[1]}]), slot=1)
        self.step("G2", self.render([{"role": "system", "content": start}, {"role": "user", "content": USERS[1]}]), slot=1)
        self.step("H1", self.render([s, {"role": "user", "content": USERS[1]}]))  # H: no id_slot
        return self.rows
