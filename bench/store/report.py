"""Summarizes bench/store/run.sh's JSON results: medians per case, the
store's cost over the page file alone, and the targets of issue 13.
`kvpage bench store` reports medians of its rounds (issue 36); runs of
before, whose figures were sums over the rounds and counted the cold first
one, are named as such under the table."""
import glob
import json
import os
import statistics
import sys

out = sys.argv[1]
runs = {}
for path in sorted(glob.glob(os.path.join(out, "*.rep*.json"))):
    name = os.path.basename(path).split(".rep")[0]
    with open(path) as f:
        run = json.load(f)
    runs.setdefault(name, []).append(run)
old = sum("per_round" not in r for v in runs.values() for r in v)


def med(name, key):
    return statistics.median(r[key] for r in runs[name])


print("| case | page file write GB/s | store put GB/s | put cost | page file read GB/s "
      "| store get GB/s | get cost | store put keys/s | store get keys/s "
      "| meta alone allocate+confirm keys/s | target | |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for name in runs:
    put_cost = 1 / med(name, "put_ratio") - 1
    get_cost = 1 / med(name, "get_ratio") - 1
    target = ""
    verdict = ""
    if name.startswith("2M"):
        limit = 0.10 if "embedded" in name else 0.20
        target = f"<= {limit:.0%}"
        verdict = "PASS" if max(put_cost, get_cost) <= limit else "MISS"
    print(f"| {name} | {med(name, 'pagefile_write_gbs'):.2f} | {med(name, 'store_put_gbs'):.2f} "
          f"| {put_cost:+.1%} | {med(name, 'pagefile_read_gbs'):.2f} "
          f"| {med(name, 'store_get_gbs'):.2f} | {get_cost:+.1%} "
          f"| {med(name, 'store_put_keys_s'):,.0f} | {med(name, 'store_get_keys_s'):,.0f} "
          f"| {med(name, 'meta_put_keys_s'):,.0f} | {target} | {verdict} |")
n = {len(v) for v in runs.values()}
print(f"\n{'/'.join(map(str, sorted(n)))} runs per case, medians of the runs.")
if old < sum(map(len, runs.values())):
    print("In a run (after one "
          "warm-up round of each side, not counted) every figure is the median of its rounds', "
          "each ratio (store GB/s / page file GB/s) the median over its pairs of consecutive "
          "rounds (one with each side first); "
          "cost = 1 / ratio - 1.")
if old:
    print(f"{old} runs are of before issue 36: their figures are sums over the rounds, the first "
          "(cold) one counted, and the ratios not to be trusted.")
