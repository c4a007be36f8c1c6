#!/usr/bin/env bash
# Fails if a test left a network namespace or a device of ours behind (tests name theirs tt*/tp*/ttprobe*).
set -euo pipefail
left_ns=$(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^tt' || true)
left_dev=$(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E '^(tt|tp)[0-9a-z]*x[0-9]+$|^ttprobe' || true)
if [[ -n "$left_ns$left_dev" ]]; then
    echo "leftovers after the tests: namespaces [$left_ns] devices [$left_dev]" >&2
    exit 1
fi
echo "no namespaces or devices left behind"
