"""POST /v1/responses through the gateway (docs/api.md "Responses"): each request is a chat
completion to the fleet, routed, queued, planned, retried, hedged and continued like any
other, and its answer is a Response (whole) or Responses streaming events, whichever engine
answers: b10587 (the sim's default) and the 2025 build (--sim-release 2025). The
official openai npm client's responses.create works unchanged, whole and streamed. What the
gateway cannot do properly (stored responses, tools) is refused in OpenAI's shape. The same
against the real b10587: test_llama.py."""

import json
import subprocess

import pytest

import fleet
import gwutil as g
from fleet import T, read_sse
from gwutil import MODEL
from test_admin import start as start_admin

RESPONSES = "/v1/responses"


def sse_events(r):
    """(type, data) of a Responses stream's named events, in order."""
    out, typ = [], None
    for line in r.iter_lines(decode_unicode=True):
        if line.startswith("event: "):
            typ = line[7:]
        elif line.startswith("data: "):
            out.append((typ, json.loads(line[6:])))
            typ = None
    return out


def node_responses(base, model):
    node = fleet.need_node_openai()
    p = subprocess.run(["node", str(node / "responses.mjs"), base + "/v1", model],
                       capture_output=True, text=True, timeout=T(120), cwd=node)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    return json.loads(p.stdout)


def check_node(res, thinking=False, usage=True):
    w = res["whole"]
    assert w["object"] == "response" and w["id"].startswith("resp_"), w
    assert w["status"] in ("completed", "incomplete"), w
    assert w["usage"]["output_tokens"] > 0 and w["usage"]["input_tokens"] > 0, w
    assert w["usage"]["total_tokens"] == w["usage"]["input_tokens"] + w["usage"]["output_tokens"], w
    if not thinking:
        assert w["output_text"], w
    s = res["stream"]
    assert s["types"][:2] == ["response.created", "response.in_progress"], s["types"]
    assert s["types"][-1] in ("response.completed", "response.incomplete"), s["types"]
    assert s["seq"] == list(range(len(s["seq"]))), s["seq"]
    assert s["final_text"] == s["text"] and s["final_reasoning"] == s["reasoning"], s
    assert s["text"] or s["reasoning"], s
    assert not usage or s["usage"]["output_tokens"] > 0, s
    ref = res["refused"]
    assert ref and ref["status"] == 400 and ref["param"] == "previous_response_id", ref


@pytest.mark.parametrize("flavour", [[], ["--sim-release", "2025"]], ids=["b10587", "2025"])
def test_responses_whole_and_streamed_on_every_engine(sim, gateway, flavour):
    p = g.phone(sim, "p1", slots=2, extra_args=flavour)
    d = g.start_gateway(gateway, [g.replica(p)])
    r = d.post(RESPONSES, json={"model": MODEL, "input": "Hello there", "max_output_tokens": 5},
               timeout=T(30))
    assert r.status_code == 200, r.text
    assert r.headers["x-fleetgate-replica"] == "p1"
    b = r.json()
    # cut at the cap: incomplete (MNN says "stop" for an answer it cut, so its is complete)
    mnn = "mnn" in flavour
    ended = "completed" if mnn else "incomplete"
    assert b["object"] == "response" and b["status"] == ended, b
    if not mnn:
        assert b["incomplete_details"] == {"reason": "max_output_tokens"}, b
    msg = [o for o in b["output"] if o["type"] == "message"]
    assert len(msg) == 1 and msg[0]["role"] == "assistant" and msg[0]["content"][0]["type"] == "output_text", b
    assert mnn or b["usage"]["output_tokens"] == 5, b  # (MNN's usage is made up: 0)
    assert b["store"] is False and b["previous_response_id"] is None, b
    # streamed: named events with their sequence numbers, text deltas that add up
    r = d.post(RESPONSES, json={"model": MODEL, "input": "Hello there", "max_output_tokens": 5,
                                "stream": True}, stream=True, timeout=T(30))
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream"), r.text
    evs = sse_events(r)
    types = [t for t, _ in evs]
    assert types[0] == "response.created" and types[-1] == f"response.{ended}", types
    assert all(t == e["type"] for t, e in evs), evs
    assert [e["sequence_number"] for _, e in evs] == list(range(len(evs)))
    text = "".join(e["delta"] for t, e in evs if t == "response.output_text.delta")
    done = [e for t, e in evs if t == "response.output_text.done"]
    assert done and done[0]["text"] == text and text, evs
    final = evs[-1][1]["response"]
    assert final["output"][-1]["content"][0]["text"] == text, final
    # (MNN's streams carry a made-up usage: the sim's --flavour mnn says 0)
    assert mnn or final["usage"]["output_tokens"] == 5, final
    # the official client, unchanged
    check_node(node_responses(d.url, MODEL), usage=not mnn)


def test_responses_refuses_what_it_cannot_do_properly(sim, gateway):
    p = g.phone(sim, "p1")
    d = g.start_gateway(gateway, [g.replica(p)])
    cases = [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"store": True}, "store"),
        ({"background": True}, "background"),
        ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]}, "tools"),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input[0]"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
         "input[0].content[0].type"),
        ({"input": None}, "input"),
    ]
    for extra, param in cases:
        body = dict({"model": MODEL, "input": "hi"}, **extra)
        body = {k: v for k, v in body.items() if v is not None}
        e = g.check_error(d.post(RESPONSES, json=body, timeout=T(10)), 400, what=param)
        assert e["param"] == param, (param, e)
    r = d.get(RESPONSES + "/resp_1")
    assert r.status_code == 404, r.text
    # a model nobody serves, as for chat
    g.check_error(d.post(RESPONSES, json={"model": "nope", "input": "hi"}, timeout=T(10)), 404,
                  code="model_not_found")
    assert p.get("/agent/v1/status").json()["requests"] >= 0


def test_a_responses_stream_goes_on_on_another_phone(sim, gateway):
    """The phone serving a Responses stream dies mid-way: another goes on with the answer so
    far, and the client's events go on as one response (one created, one completed, the
    text deltas adding up to the final text)."""
    a = g.phone(sim, "a", slots=1, decode_tps=5, fault_plan=[{"at_s": 0, "kind": "drop", "dur_s": 3600}])
    b = g.phone(sim, "b", slots=1, decode_tps=5)
    d, adm = start_admin(gateway, [g.replica(a, prefill_tps=1e6, decode_tps=1e5), g.replica(b)])
    r = d.post(RESPONSES, json={"model": MODEL, "input": "tell me a story", "max_output_tokens": 30,
                                "stream": True}, stream=True, timeout=T(60))
    assert r.status_code == 200, r.text
    evs = sse_events(r)
    types = [t for t, _ in evs]
    assert types.count("response.created") == 1 and types[-1] == "response.incomplete", types
    text = "".join(e["delta"] for t, e in evs if t == "response.output_text.delta")
    final = evs[-1][1]["response"]
    assert final["output"][-1]["content"][0]["text"] == text and text, final
    assert final["usage"]["output_tokens"] == 30, final
    assert a.get("/agent/v1/status").json()["requests"] >= 1
    assert b.get("/agent/v1/status").json()["requests"] >= 1
