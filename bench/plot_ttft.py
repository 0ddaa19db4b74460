#!/usr/bin/env python3
"""plot_ttft.py RECORDS.jsonl OUT.png: time to first token per turn and cache mode,
from the per-turn records `kvtier-bench e2e --records` writes (the chat workload's
sessions; the zero-reuse ones are left out).

Each mode is a line through the per-turn medians, with a bar from the fastest to
the slowest turn of that index and every turn drawn as a dot, on a log scale
(recomputing is tens of times slower than reading the cache). --title sets the
title; the machine and model belong in it.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import textwrap

import matplotlib

matplotlib.use("Agg")  # Files only: no display here or in CI.
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"kvtier": "#1f77b4", "local": "#2ca02c", "none": "#d62728"}
LABELS = {"kvtier": "kvtier (prefix from kvtierd)", "local": "local (in-process K/V cache)",
          "none": "none (recompute every turn)"}


def load(path: str) -> dict[str, dict[int, list[float]]]:
    """{mode: {turn: [ttft_ms, ...]}} over the chat sessions."""
    out: dict[str, dict[int, list[float]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r["session"].startswith("zero-"):
                continue
            out[r["mode"]][int(r["turn"])].append(float(r["ttft_ms"]))
    if not out:
        raise SystemExit(f"plot_ttft: {path} holds no chat-workload turns")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("records")
    p.add_argument("out", help="the image to write (.png or .svg)")
    p.add_argument("--title", default="Time to first token per turn")
    a = p.parse_args()
    data = load(a.records)
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    modes = [m for m in ("none", "local", "kvtier") if m in data] + sorted(set(data) - set(COLORS))
    for k, mode in enumerate(modes):
        turns = sorted(data[mode])
        shift = (k - (len(modes) - 1) / 2) * 0.08  # Side by side, so the bars do not cover each other.
        xs = [t + 1 + shift for t in turns]
        med = [statistics.median(data[mode][t]) for t in turns]
        lo = [m - min(data[mode][t]) for m, t in zip(med, turns)]
        hi = [max(data[mode][t]) - m for m, t in zip(med, turns)]
        color = COLORS.get(mode, "gray")
        ax.errorbar(xs, med, yerr=[lo, hi], color=color, marker="o", capsize=4, label=LABELS.get(mode, mode))
        for x, t in zip(xs, turns):
            ax.scatter([x] * len(data[mode][t]), data[mode][t], color=color, s=8, alpha=0.35)
    ax.set_yscale("log")
    ax.set_xlabel("turn (1: a new document after the shared system prompt; then follow-ups)")
    ax.set_ylabel("time to first token, ms (log)")
    ax.set_xticks(range(1, 1 + max(max(d) for d in data.values()) + 1))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    ax.set_title(textwrap.fill(a.title, 90), fontsize=10)
    fig.tight_layout()
    fig.savefig(a.out)
    print(f"plot_ttft: wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
