#!/usr/bin/env bash
# A soak of the WireGuard endpoint: two `turbotun wg` endpoints in private namespaces joined by a veth pair,
# iperf3 TCP through the tunnel for SECONDS (default 600), the resident memory (VmRSS) of both endpoints sampled
# every 30 s. Prints one line per sample and the counters each endpoint prints when stopped.
# Usage: scripts/wg-soak.sh [SECONDS] [TURBOTUN]   (TURBOTUN: default target/release/turbotun)
set -euo pipefail
umask 077
seconds=${1:-600}
turbotun=${2:-$(dirname "$0")/../target/release/turbotun}
source "$(dirname "$0")/wg-pair.sh"
wg_pair_up "$turbotun" soak 51900
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
