#!/usr/bin/python3
"""Charts (PNG) for the benchmark results, with Debian's python3-matplotlib.

    tests/bench/charts.py              # redraw every chart from tests/bench/results/*.json
Each benchmark calls the matching function itself when it finishes."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as bl  # noqa: E402

COLORS = {"direct": "#888888", "nginx": "#2a9d8f", "haproxy": "#e9c46a", "portkey": "#9b5de5",
          "fleetgate": "#e76f51"}


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def b1(out):
    plt = _plt()
    s = out["summary"]
    protos = sorted({x["proto"] for x in s}, key=lambda p: p != "http")
    targets = [t for t in ("direct", "nginx", "haproxy", "portkey", "fleetgate") if any(x["target"] == t for x in s)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    w = 0.8 / max(1, len(protos))
    for k, proto in enumerate(protos):
        xs, ys, lo, hi = [], [], [], []
        for i, t in enumerate(targets):
            r = next((x for x in s if x["target"] == t and x["proto"] == proto), None)
            if r and r["rps_med"]:
                xs.append(i + k * w)
                ys.append(r["rps_med"])
                lo.append(r["rps_med"] - r["rps_min"])
                hi.append(r["rps_max"] - r["rps_med"])
        axes[0].bar(xs, ys, w, yerr=[lo, hi], label=proto.upper(), capsize=3,
                    color=["#457b9d", "#1d3557"][k % 2])
    axes[0].set_xticks([i + w * (len(protos) - 1) / 2 for i in range(len(targets))], targets)
    axes[0].set_ylabel("requests/s (median, min-max)")
    axes[0].set_title("B1 throughput, wrk keep-alive, 1 core per proxy")
    axes[0].legend()
    for k, proto in enumerate(protos):
        xs, ys = [], []
        for i, t in enumerate(targets):
            r = next((x for x in s if x["target"] == t and x["proto"] == proto), None)
            if r and r["hey_p99_med"] is not None:
                xs.append(i + k * w)
                ys.append(r["hey_p99_med"])
        axes[1].bar(xs, ys, w, label=proto.upper(), color=["#457b9d", "#1d3557"][k % 2])
    axes[1].set_xticks([i + w * (len(protos) - 1) / 2 for i in range(len(targets))], targets)
    axes[1].set_yscale("log")
    axes[1].set_ylabel("p99 latency, ms (log)")
    axes[1].set_title(f"B1 p99 at a fixed {out['params']['hey_rate']:.0f} req/s (hey)")
    axes[1].legend()
    fig.tight_layout()
    p = bl.RESULTS / "b1_overhead.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def b2(out, name="b2_goodput"):
    plt = _plt()
    res = out["results"]
    scen = [s for s in ("steady", "churn", "slow") if any(r["scenario"] == s for r in res)]
    proxies = [p for p in ("nginx", "haproxy", "portkey", "fleetgate") if any(r["proxy"] == p for r in res)]
    paths = []
    fig, axes = plt.subplots(1, len(scen), figsize=(4.2 * len(scen), 3.8), squeeze=False)
    for ax, s in zip(axes[0], scen):
        for p in proxies:
            rr = sorted([r for r in res if r["scenario"] == s and r["proxy"] == p], key=lambda r: r["load_pct"])
            ax.plot([r["load_pct"] for r in rr], [r["goodput_share_capacity"] * 100 for r in rr], "o-",
                    label=p, color=COLORS.get(p))
        loads = sorted({r["load_pct"] for r in res})
        ax.plot(loads, loads, ":", color="#999999", label="offered")
        ax.set_title(f"B2 goodput — {s}")
        ax.set_xlabel("offered load, % of capacity")
        ax.set_ylabel("completed OK, % of capacity")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    p = bl.RESULTS / f"{name}_goodput.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)

    # Latency percentiles per class, at the highest load below 100 % (or the only load).
    loads = sorted({r["load_pct"] for r in res})
    pick = max([l for l in loads if l < 100] or loads)
    classes = ("fraud", "scam", "chat", "chat TTFT")
    fig, axes = plt.subplots(len(scen), len(classes), figsize=(3.4 * len(classes), 2.9 * len(scen)), squeeze=False)
    for i, s in enumerate(scen):
        for j, c in enumerate(classes):
            ax = axes[i][j]
            for k, p in enumerate(proxies):
                r = next((r for r in res if r["scenario"] == s and r["proxy"] == p and r["load_pct"] == pick), None)
                if not r:
                    continue
                st = r["classes"]["chat" if c == "chat TTFT" else c]
                keys = ("ttft_p50", "ttft_p95", "ttft_p99") if c == "chat TTFT" else ("p50", "p95", "p99")
                vals = [st.get(x) or 0 for x in keys]
                ax.bar([q + k * 0.2 for q in range(3)], vals, 0.2, label=p, color=COLORS.get(p))
            ax.set_xticks([0.3, 1.3, 2.3], ["p50", "p95", "p99"])
            ax.set_title(f"{s}: {c}", fontsize=9)
            ax.set_ylabel("phone seconds", fontsize=8)
            ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"B2 latency per class at {pick} % load (successful requests; lower is better)", fontsize=10)
    fig.tight_layout()
    p = bl.RESULTS / f"{name}_latency.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    return paths


def b3(out):
    plt = _plt()
    res = out["results"]
    proxies = [p for p in ("nginx", "haproxy", "fleetgate") if any(r["proxy"] == p for r in res)]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for p in proxies:
        rr = sorted([r for r in res if r["proxy"] == p], key=lambda r: r["streams"])
        axes[0].plot([r["streams"] for r in rr], [(r["rss_hold_kb"] or 0) / 1024 for r in rr], "o-", label=p,
                     color=COLORS.get(p))
        axes[1].plot([r["streams"] for r in rr], [r["kb_per_stream"] or 0 for r in rr], "o-", label=p,
                     color=COLORS.get(p))
    axes[0].set_xlabel("concurrent streams")
    axes[0].set_ylabel("resident memory, MB")
    axes[0].set_title("B3 proxy RSS holding N streams")
    axes[1].axhline(20, ls=":", color="#999999", label="target 20 KB")
    axes[1].set_xlabel("concurrent streams")
    axes[1].set_ylabel("KB per stream")
    axes[1].set_title("B3 memory per stream")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    p = bl.RESULTS / "b3_streams.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def b4(out):
    plt = _plt()
    rows = out["results"]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    labels = [r["what"] for r in rows]
    vals = [r["rss_mb"] or 0 for r in rows]
    cols = ["#e76f51" if "gateway" in r["what"] else "#457b9d" for r in rows]
    ax.barh(labels, vals, color=cols)
    for r, v in zip(rows, vals):
        if r.get("target_mb"):
            ax.plot([r["target_mb"]], [r["what"]], "k|", markersize=18)
    ax.set_xlabel("resident memory, MB (| = target)")
    ax.set_title("B4 footprints")
    ax.invert_yaxis()
    fig.tight_layout()
    p = bl.RESULTS / "b4_footprint.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


if __name__ == "__main__":
    for name, fn in (("b1_overhead", b1), ("b2_goodput", b2), ("b2_goodput_quick", None),
                     ("b3_streams", b3), ("b4_footprint", b4)):
        f = bl.RESULTS / f"{name}.json"
        if f.exists():
            d = json.loads(f.read_text())
            print(b2(d, name) if fn is None else fn(d))
