#!/usr/bin/env bash
# A soak of the WireGuard endpoint: two `turbotun wg` endpoints in private namespaces joined by a veth pair,
# iperf3 TCP through the tunnel for SECONDS (default 600), the resident memory (VmRSS) of both endpoints sampled
# every 30 s. Prints one line per sample and the counters each endpoint prints when stopped.
# Usage: scripts/wg-soak.sh [SECONDS] [TURBOTUN]   (TURBOTUN: default target/release/turbotun)
set -euo pipefail
umask 077
seconds=${1:-600}
turbotun=${2:-$(dirname "$0")/../target/release/turbotun}
tag=$$
a=soaka$tag b=soakb$tag wa=wsa$tag wb=wsb$tag
dir=$(mktemp -d)
cleanup() {
    for ns in $a $b; do ip netns pids $ns 2>/dev/null | xargs -r kill 2>/dev/null || true; done
    sleep 0.5
    ip netns del $a 2>/dev/null || true
    ip netns del $b 2>/dev/null || true
    rm -rf "$dir" "/var/run/wireguard/$wa.sock" "/var/run/wireguard/$wb.sock"
}
trap cleanup EXIT
ip netns add $a; ip netns add $b
ip link add ul$tag netns $a type veth peer name ur$tag netns $b
ip -n $a addr add 10.201.0.1/24 dev ul$tag; ip -n $a link set ul$tag up; ip -n $a link set lo up
ip -n $b addr add 10.201.0.2/24 dev ur$tag; ip -n $b link set ur$tag up; ip -n $b link set lo up
ip netns exec $a "$turbotun" wg -f $wa >"$dir/a.out" 2>"$dir/a.err" & pa=$!
ip netns exec $b "$turbotun" wg -f $wb >"$dir/b.out" 2>"$dir/b.err" & pb=$!
for _ in $(seq 50); do [[ -S /var/run/wireguard/$wa.sock && -S /var/run/wireguard/$wb.sock ]] && break; sleep 0.1; done
wg genkey >"$dir/ka"; wg genkey >"$dir/kb"
ip netns exec $a wg set $wa private-key "$dir/ka" listen-port 51900 peer "$(wg pubkey <"$dir/kb")" endpoint 10.201.0.2:51901 allowed-ips 10.202.0.2/32
ip netns exec $b wg set $wb private-key "$dir/kb" listen-port 51901 peer "$(wg pubkey <"$dir/ka")" endpoint 10.201.0.1:51900 allowed-ips 10.202.0.1/32
ip -n $a addr add 10.202.0.1/24 dev $wa; ip -n $a link set $wa mtu 1420 up
ip -n $b addr add 10.202.0.2/24 dev $wb; ip -n $b link set $wb mtu 1420 up
ip netns exec $b iperf3 -s -D -1 -p 5299
sleep 0.5
ip netns exec $a iperf3 -c 10.202.0.2 -p 5299 -t "$seconds" -J >"$dir/iperf.json" &
iperf=$!
rss() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
# The endpoints are the children of `ip netns exec`, which execs them: the pids are theirs.
start=$(date +%s)
while kill -0 $iperf 2>/dev/null; do
    echo "t=$(( $(date +%s) - start ))s rss_a=$(rss $pa)kB rss_b=$(rss $pb)kB"
    sleep 30
done
python3 -c "import json; e=json.load(open('$dir/iperf.json'))['end']; print('tcp %.2f Gbps over %d s, %d retransmits' % (e['sum_received']['bits_per_second']/1e9, e['sum_received']['seconds'], e['sum_sent']['retransmits']))"
kill -TERM $pa $pb; wait $pa $pb || true
echo "a: $(tail -1 "$dir/a.out")"
echo "b: $(tail -1 "$dir/b.out")"
