#!/usr/bin/env bash
# System calls per direction of a WireGuard tunnel between two `turbotun wg` endpoints (two private namespaces,
# a veth underlay, iperf3 TCP one stream from A to B for SECONDS): each endpoint's system calls counted by name
# (perf stat on the syscall tracepoints) and divided by the TCP super-packets and the 64 KiB units it carried
# in the data direction (A: TUN reads + sendmmsg; B: recvmmsg + TUN writes), from the endpoints' own counters.
# Usage: scripts/tunnel-syscalls.sh [SECONDS] [TURBOTUN]
set -euo pipefail
umask 077
seconds=${1:-5}
turbotun=${2:-$(dirname "$0")/../target/release/turbotun}
source "$(dirname "$0")/wg-pair.sh"
wg_pair_up "$turbotun" sc 51910
ip netns exec $a ping -c 1 -W 2 10.202.0.2 >/dev/null
ip netns exec $b iperf3 -s -D -1 -p 5298
sleep 0.3
events=syscalls:sys_enter_preadv2,syscalls:sys_enter_sendmmsg,syscalls:sys_enter_recvmmsg,syscalls:sys_enter_writev,syscalls:sys_enter_ppoll,syscalls:sys_enter_futex
perf stat -x, -e "$events" -p $pa -o "$dir/a.stat" -- sleep "$seconds" &
perf stat -x, -e "$events" -p $pb -o "$dir/b.stat" -- sleep "$seconds" &
ip netns exec $a iperf3 -c 10.202.0.2 -p 5298 -t "$seconds" -J >"$dir/iperf.json"
wait %3 %4 2>/dev/null || sleep 1
kill -TERM $pa $pb; wait $pa $pb || true
python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
def stat(end):
    counts = {}
    for line in open(f"{d}/{end}.stat"):
        f = line.strip().split(",")
        if len(f) > 2 and f[2].startswith("syscalls:sys_enter_"):
            counts[f[2][len("syscalls:sys_enter_"):]] = int(f[0]) if f[0].isdigit() else 0
    return counts
def counters(end):
    return json.loads(open(f"{d}/{end}.out").read().strip().splitlines()[-1])
e = json.load(open(f"{d}/iperf.json"))["end"]
print("tcp %.2f Gbps" % (e["sum_received"]["bits_per_second"] / 1e9))
for end, data, calls in [("a", "to_network", ("preadv2", "sendmmsg")), ("b", "from_network", ("recvmmsg", "writev"))]:
    s, c = stat(end), counters(end)[data]
    units = c["bytes"] / 65536
    supers = c["super_packets"] if end == "a" else None
    n = sum(s.get(k, 0) for k in calls)
    line = f"{end}: data direction {'+'.join(calls)} = {n} for {c['bytes']/1e9:.2f} GB: {n/units:.2f} per 64 KiB"
    if supers:
        line += f", {n/supers:.2f} per super-packet read ({supers})"
    print(line + "; all counted: " + ", ".join(f"{k} {v}" for k, v in sorted(s.items())))
PY
