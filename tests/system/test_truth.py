"""What operators see must be true (issue 19, part 7): a stream that ended in an error is
counted as failed with the tokens its client got, failure and state reasons say what
happened, phones joining by heartbeat or leaving the registry show in the events, and
the status page opens in a browser through a session cookie after one login.

The gateway listens on two free ports: the client API (ports[0]) and admin (ports[1])."""

import requests

import fleet
import gwutil as g
from fleet import T, wait_until
from test_admin import start

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


def test_a_stream_cut_mid_answer_is_not_a_connect_failure(sim, gateway):
    dropper = g.phone(sim, "dropper", slots=1, decode_tps=20, fault_plan=DROP_ALWAYS)
    gw, admin = start(gateway, [g.replica(dropper)], health={"interval_s": 0})
    cut_stream(gw)
    fail = g.log_msgs(gw, "attempt failed", replica="dropper")
    assert fail and fail[0]["reason"] == "cut" and fail[0]["stream_started"] is True, fail
    m = admin.metrics()
    assert m['fleetgate_upstream_failures_total{reason="cut"}'] == 1, m
    assert m['fleetgate_upstream_failures_total{reason="connect"}'] == 0, m
