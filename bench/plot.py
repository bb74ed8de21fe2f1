#!/usr/bin/env python3
"""Chart for `weir-bench suite`: TPS and proxy CPU per transaction per workload,
every target (direct, weir, PgBouncer, pg_doorman, per thread count) side by
side. Usage: plot.py results.json out.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"direct": "#9e9e9e", "weir": "#1f77b4", "PgBouncer": "#ff7f0e", "pg_doorman": "#2ca02c"}
MORE = ["#17becf", "#98df8a", "#aec7e8", "#d62728", "#9467bd"]


def color(kind, i):
    return COLORS.get(kind, MORE[i % len(MORE)])


def main(src, dst):
    rows = json.load(open(src))["rows"]
    titles = [r["title"] for r in rows]
    kinds = []
    for r in rows:
        kinds += [k for k in r["cells"] if k not in kinds]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(12, 9), sharex=True)
    width = 0.8 / max(len(kinds), 1)
    for i, kind in enumerate(kinds):
        xs = [j + (i - (len(kinds) - 1) / 2) * width for j in range(len(rows))]
        cells = [r["cells"].get(kind, {}) for r in rows]
        tps = [0 if c.get("skipped") or c.get("failed") else c.get("tps", 0) for c in cells]
        ax1.bar(xs, tps, width, label=kind, color=color(kind, i))
        cpu = [c.get("cpu_us_per_txn") or 0 for c in cells]
        if kind != "direct":
            ax2.bar(xs, cpu, width, label=kind, color=color(kind, i))
    ax1.set_ylabel("transactions / s (median)")
    ax1.set_yscale("log")
    ax1.legend()
    ax1.set_title("weir vs other poolers vs direct Postgres (pool 20, transaction mode)")
    ax2.set_ylabel("proxy CPU µs / transaction")
    ax2.set_yscale("log")
    ax2.legend()
    ax2.set_xticks(range(len(rows)))
    ax2.set_xticklabels(titles, rotation=30, ha="right")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
