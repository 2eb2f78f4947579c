#!/usr/bin/env python3
"""Puts `mxmoe bench --json` runs of two builds side by side.

Usage: tools/measure/bench_compare.py OLD.json[,OLD2.json...] NEW.json[,NEW2.json...]

For each (model, T) row: every run's us per layer, each build's mean, and new / old. Runs of one
build taken alternately with the other's in one device call show the spread of identical code.
"""
import json
import sys


def rows(paths):
    runs = [json.load(open(p)) for p in paths.split(",")]
    table = {}
    for run in runs:
        for r in run["rows"]:
            table.setdefault((r["model"], r["tokens"]), []).append(r["us_per_layer"])
    return table, runs


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    old, old_runs = rows(sys.argv[1])
    new, new_runs = rows(sys.argv[2])
    print(f"old: {old_runs[0]['git_revision']}, new: {new_runs[0]['git_revision']}, "
          f"device: {new_runs[0]['device']['name']}")
    print(f"{'model':<13} {'T':>5}  {'old us':<20} {'new us':<20} {'new/old':>8}")
    worst = 0.0
    for key in sorted(set(old) & set(new), key=lambda k: (k[0], k[1])):
        o, n = old[key], new[key]
        ratio = (sum(n) / len(n)) / (sum(o) / len(o))
        worst = max(worst, abs(ratio - 1))
        print(f"{key[0]:<13} {key[1]:>5}  {' / '.join(f'{v:.1f}' for v in o):<20} "
              f"{' / '.join(f'{v:.1f}' for v in n):<20} {ratio:>8.3f}")
    print(f"largest difference of the means: {100 * worst:.1f} %")


if __name__ == "__main__":
    main()
