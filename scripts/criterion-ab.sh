#!/usr/bin/env bash
# Interleaved criterion A/B of turbotun-wire (usage: scripts/criterion-ab.sh BEFORE_TREE AFTER_TREE [ROUNDS] [FILTER]):
# the two trees' `benches/wire.rs` run in turn ROUNDS times; prints the medians (min-max) of each round's median
set -euo pipefail
BEFORE=$1; AFTER=$2; ROUNDS=${3:-5}; FILTER=${4:-gro_coalesce}
export PATH=$HOME/.cargo/bin:$PATH
for tree in "$BEFORE" "$AFTER"; do (cd "$tree" && cargo bench -p turbotun-wire --bench wire --no-run -q 2>/dev/null); done
for r in $(seq 1 "$ROUNDS"); do
  for tree in "$BEFORE" "$AFTER"; do
    (cd "$tree" && cargo bench -q -p turbotun-wire --bench wire -- "$FILTER" --save-baseline "ab$r" --warm-up-time 1 --measurement-time 3 >/dev/null 2>&1)
  done
done
python3 - "$BEFORE" "$AFTER" "$ROUNDS" <<'PY'
import json,sys,glob,os,statistics
before,after,rounds=sys.argv[1],sys.argv[2],int(sys.argv[3])
def runs(tree):
    out={}
    for est in glob.glob(f"{tree}/target/criterion/*/*/ab1/estimates.json"):
        bench=os.path.relpath(os.path.dirname(os.path.dirname(est)), f"{tree}/target/criterion")
        vals=[]
        for r in range(1,rounds+1):
            p=f"{tree}/target/criterion/{bench}/ab{r}/estimates.json"
            vals.append(json.load(open(p))["median"]["point_estimate"])
        out[bench]=vals
    return out
b,a=runs(before),runs(after)
print("| benchmark | before ns, median (min–max) | after ns, median (min–max) | after / before |")
print("|---|---|---|---|")
for k in sorted(b):
    if k not in a: continue
    mb,ma=statistics.median(b[k]),statistics.median(a[k])
    print(f"| `{k}` | {mb:,.0f} ({min(b[k]):,.0f}–{max(b[k]):,.0f}) | {ma:,.0f} ({min(a[k]):,.0f}–{max(a[k]):,.0f}) | {ma/mb:.3f} |")
PY
