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
tag=$$ a=scta$$ b=sctb$$ wa=wca$$ wb=wcb$$
dir=$(mktemp -d)
cleanup() {
    for ns in $a $b; do ip netns pids $ns 2>/dev/null | xargs -r kill 2>/dev/null || true; done
    sleep 0.5
    ip netns del $a 2>/dev/null || true; ip netns del $b 2>/dev/null || true
    rm -rf "$dir" "/var/run/wireguard/$wa.sock" "/var/run/wireguard/$wb.sock"
}
trap cleanup EXIT
ip netns add $a; ip netns add $b
ip link add ul$tag netns $a type veth peer name ur$tag netns $b
ip -n $a addr add 10.201.0.1/24 dev ul$tag; ip -n $a link set ul$tag up; ip -n $a link set lo up
ip -n $b addr add 10.201.0.2/24 dev ur$tag; ip -n $b link set ur$tag up; ip -n $b link set lo up
ip netns exec $a "$turbotun" wg -f $wa >"$dir/a.out" 2>/dev/null & pa=$!
ip netns exec $b "$turbotun" wg -f $wb >"$dir/b.out" 2>/dev/null & pb=$!
for _ in $(seq 50); do [[ -S /var/run/wireguard/$wa.sock && -S /var/run/wireguard/$wb.sock ]] && break; sleep 0.1; done
wg genkey >"$dir/ka"; wg genkey >"$dir/kb"
ip netns exec $a wg set $wa private-key "$dir/ka" listen-port 51910 peer "$(wg pubkey <"$dir/kb")" endpoint 10.201.0.2:51911 allowed-ips 10.202.0.2/32
ip netns exec $b wg set $wb private-key "$dir/kb" listen-port 51911 peer "$(wg pubkey <"$dir/ka")" endpoint 10.201.0.1:51910 allowed-ips 10.202.0.1/32
ip -n $a addr add 10.202.0.1/24 dev $wa; ip -n $a link set $wa mtu 1420 up
ip -n $b addr add 10.202.0.2/24 dev $wb; ip -n $b link set $wb mtu 1420 up
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
