#!/usr/bin/env bash
# How much of an idle `turbotun fwd`'s resident memory is its own: N forwarders (default 2), each between two
# TUN devices of its own in one private namespace, and for each the kernel's resident (VmHWM, RssAnon, RssFile)
# and proportional (Pss: shared pages divided among the processes that map them) figures, in kB.
# Usage: scripts/rss-shared.sh TURBOTUN [N]
set -euo pipefail
turbotun=$(realpath "$1") n=${2:-2} ns=rss$$
pids=()
down() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
}
trap down EXIT
trap 'exit 130' INT TERM
ip netns add "$ns"
for i in $(seq "$n"); do
    ip netns exec "$ns" "$turbotun" fwd "r${i}a$$" "r${i}b$$" >/dev/null 2>&1 &
    pids+=($!)
done
sleep 2
printf '%-8s %8s %8s %8s %8s %8s\n' pid VmHWM RssAnon RssFile Pss Pss_Anon
for p in "${pids[@]}"; do
    read -r hwm anon file < <(awk '/^VmHWM|^RssAnon|^RssFile/ { printf "%s ", $2 } END { print "" }' "/proc/$p/status")
    read -r pss pss_anon < <(awk '/^Pss:|^Pss_Anon:/ { printf "%s ", $2 } END { print "" }' "/proc/$p/smaps_rollup")
    printf '%-8s %8s %8s %8s %8s %8s\n' "$p" "$hwm" "$anon" "$file" "$pss" "$pss_anon"
done
