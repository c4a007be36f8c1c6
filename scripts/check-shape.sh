#!/usr/bin/env bash
# The shape the docs promise, checked by the tree (run by `make lint`):
# - no Rust source file (code or test) of the repository longer than 800 lines: split a longer one by what it holds;
# - no `too_many_arguments` allowance: what travels together is a type of its own (a `Batch`, a path, an attempt);
# - BENCHMARKS.md at most 350 lines: one current table per area; every A/B and superseded run goes to HISTORY.md;
# - every result file under docs/bench/ that BENCHMARKS.md's table of current files does not list says in its first
#   line that it is superseded, so that no old figure reads as a current one.
set -euo pipefail
cd "$(dirname "$0")/.."
MAX_LINES=800
MAX_BENCHMARKS_LINES=350
failed=0

while IFS= read -r file; do
    lines=$(wc -l < "$file")
    if (( lines > MAX_LINES )); then
        echo "check-shape: $file has $lines lines (at most $MAX_LINES): split it by what it holds" >&2
        failed=1
    fi
done < <(git ls-files -- '*.rs')

if allowances=$(git grep -n 'too_many_arguments' -- '*.rs'); then
    echo "check-shape: a too_many_arguments allowance: pass what travels together as one value" >&2
    echo "$allowances" >&2
    failed=1
fi

benchmarks_lines=$(wc -l < BENCHMARKS.md)
if (( benchmarks_lines > MAX_BENCHMARKS_LINES )); then
    echo "check-shape: BENCHMARKS.md has $benchmarks_lines lines (at most $MAX_BENCHMARKS_LINES): move A/Bs and superseded runs to docs/bench/HISTORY.md" >&2
    failed=1
fi

current=$(sed -n "/^The current tables' files/,\$p" BENCHMARKS.md | grep -o 'docs/bench/[A-Za-z0-9._-]*\.md' | sort -u)
for file in docs/bench/*.md; do
    [[ $file == docs/bench/HISTORY.md ]] && continue
    grep -qx "$file" <<< "$current" && continue
    if [[ $(head -c 12 "$file") != "> Superseded" ]]; then
        echo "check-shape: $file is not among BENCHMARKS.md's current files and does not begin \"> Superseded: WHY\"" >&2
        failed=1
    fi
done

exit $failed
