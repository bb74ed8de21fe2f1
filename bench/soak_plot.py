#!/usr/bin/env python3
"""Chart for `weir-bench soak`: the per-second series of soak.csv with the
faults of faults.csv shaded. Usage: soak_plot.py OUT_DIR (writes OUT_DIR/soak.png)."""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = ["#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


def num(v):
    return float(v) if v not in ("", None) else float("nan")


def main(out):
    rows = list(csv.DictReader(open(os.path.join(out, "soak.csv"))))
    faults = list(csv.DictReader(open(os.path.join(out, "faults.csv"))))
    t = [num(r["t_s"]) for r in rows]
    for r in rows:
        r["rss_mib"] = num(r["rss_kib"]) / 1024.0
    col = lambda k: [num(r[k]) if not isinstance(r[k], float) else r[k] for r in rows]  # noqa: E731
    fig, axes = plt.subplots(5, 1, figsize=(14, 15), sharex=True)
    panels = [
        (axes[0], [("tps", "transactions / s", "#1f77b4")], [("p99_ms", "p99 ms", "#ff7f0e")]),
        (axes[1], [("rss_mib", "RSS MiB", "#2ca02c")], [("fds", "open fds", "#9467bd")]),
        (axes[2], [("servers", "pool servers", "#1f77b4")], [("waiters", "waiting clients", "#d62728")]),
        (axes[3], [("server_opens", "server opens / s", "#2ca02c"), ("server_closes", "server closes / s", "#d62728")], []),
        (axes[4], [("errors", "client errors / s", "#d62728")], []),
    ]
    for ax, left, right in panels:
        for key, label, color in left:
            ax.plot(t, col(key), label=label, color=color, lw=0.8)
        ax.set_ylabel(" / ".join(lbl for _, lbl, _ in left))
        handles, labels = ax.get_legend_handles_labels()
        if right:
            ax2 = ax.twinx()
            for key, label, color in right:
                ax2.plot(t, col(key), label=label, color=color, lw=0.8, alpha=0.8)
            ax2.set_ylabel(" / ".join(lbl for _, lbl, _ in right))
            h2, l2 = ax2.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
        ax.legend(handles, labels, loc="upper right", fontsize=8)
        names = sorted({f["fault"] for f in faults})
        for f in faults:
            c = COLORS[names.index(f["fault"]) % len(COLORS)]
            start, end = num(f["start_s"]), num(f["end_s"])
            ax.axvspan(start, max(end, start + 0.5), color=c, alpha=0.25, lw=0)
    for f in faults:
        axes[0].annotate(f["fault"], (num(f["start_s"]), 1.0), xycoords=("data", "axes fraction"),
                         rotation=90, fontsize=7, va="top", ha="right")
    axes[4].set_yscale("symlog")
    axes[-1].set_xlabel("seconds since the load started (shaded: faults)")
    summary = os.path.join(out, "summary.txt")
    title = "weir-bench soak"
    if os.path.exists(summary):
        first = [ln for ln in open(summary) if ln.startswith("== soak summary")]
        if first:
            title = first[0].strip("= \n")
    axes[0].set_title(title)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "soak.png"), dpi=90)


if __name__ == "__main__":
    main(sys.argv[1])
