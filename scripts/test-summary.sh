#!/usr/bin/env bash
# The last word of `make test`: how many tests did not run. The suite's skip rule
# (crates/turbotun/tests/common/skip.rs) appends a line to the log named here for every test that could not run
# on this machine (no root, a kernel feature or a tool missing) and so returned without testing anything. cargo
# reports those as passed; this summary says how many there were and fails the run, so that a run without root
# never reads as the whole suite passing. Under CI=true such a test fails by itself and the log stays empty.
set -euo pipefail
log=${1:?usage: test-summary.sh SKIPPED_LOG}
if [[ ! -s $log ]]; then
    echo "test summary: every test ran (none skipped)"
    exit 0
fi
count=$(wc -l <"$log")
echo "test summary: $count test(s) did NOT run on this machine, although cargo listed them as passed:" >&2
sort "$log" | sed 's/^/  /' >&2
echo "test summary: run \`make test\` as root to run them (under CI=true each one fails instead of skipping)" >&2
exit 1
