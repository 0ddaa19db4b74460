#!/usr/bin/env python3
"""Compares two builds of kvtier-bench, interleaved, in one run.

    bench/compare_builds.py OLD_BENCH NEW_BENCH PAIRS [SUBCOMMAND ARGS...]

Runs `OLD_BENCH SUBCOMMAND...` and `NEW_BENCH SUBCOMMAND...` PAIRS times each,
alternating which goes first, and reads the JSON object each prints last. For
every numeric figure both report it gives both medians and the per-pair ratio new/old
(median, min, max): on a noisy machine the spread of the pairs says whether a
difference is real. The last line of output is one JSON object.

Example (the engine bench of a checkout of the previous commit against this one):
    git worktree add /tmp/old HEAD~1 && cmake -S /tmp/old -B /tmp/old/build -G Ninja \\
        && cmake --build /tmp/old/build --target kvtier-bench
    bench/compare_builds.py /tmp/old/build/bench/kvtier-bench build/bench/kvtier-bench 10 engine
"""
import json
import statistics
import subprocess
import sys


def run(bench, args):
    out = subprocess.run([bench] + args, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    if len(sys.argv) < 4 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help") else 2
    old, new, pairs, args = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:] or ["engine"]
    runs = {"old": [], "new": []}
    for i in range(pairs):
        order = (("old", old), ("new", new)) if i % 2 == 0 else (("new", new), ("old", old))
        for name, bench in order:
            runs[name].append(run(bench, args))
        print(f"pair {i + 1}/{pairs} done", file=sys.stderr)
    figures = {}
    only_new = []  # Figures the old build does not report.
    for key, value in runs["new"][0].items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if any(key not in r for r in runs["old"]):
            only_new.append(key)
            continue
        o = [r[key] for r in runs["old"]]
        n = [r[key] for r in runs["new"]]
        ratios = [b / a for a, b in zip(o, n) if a]
        figures[key] = {
            "old_median": statistics.median(o),
            "new_median": statistics.median(n),
            "ratio_median": round(statistics.median(ratios), 3) if ratios else None,
            "ratio_min": round(min(ratios), 3) if ratios else None,
            "ratio_max": round(max(ratios), 3) if ratios else None,
        }
    print(json.dumps({"pairs": pairs, "args": args, "figures": figures, "only_new": only_new}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
