#!/usr/bin/env bash
# Smoke test of one forwarder process against the CONTRACTS.md "Forwarder processes" contract, in
# the BENCH.md topology: two private network namespaces made here, one TUN device moved into each,
# ping and a short iperf3 TCP test across the forwarder. Needs root, iproute2, iperf3, jq (ping is
# optional). Everything it creates has a unique name and is removed on every exit path.
#
#   bench/peers/smoke.sh FWD_BINARY MODE [SECONDS]
#   e.g. bench/peers/smoke.sh bench/peers/bin/tunrs-fwd offload 3
#
# Prints one summary line: mode, receiver Gbps, retransmits, the forwarder's JSON counters.
# Exits non-zero when the contract or connectivity fails.
set -euo pipefail

fwd="${1:?usage: smoke.sh FWD_BINARY MODE [SECONDS]}"
mode="${2:?usage: smoke.sh FWD_BINARY MODE [SECONDS]}"
secs="${3:-3}"
[[ -x "$fwd" ]] || { echo "smoke.sh: $fwd is not executable (run bench/peers/build.sh)" >&2; exit 2; }
for t in ip iperf3 jq; do command -v "$t" >/dev/null || { echo "smoke.sh: $t not found" >&2; exit 2; }; done
[[ $(id -u) == 0 ]] || { echo "smoke.sh: needs root" >&2; exit 2; }

id="$$$RANDOM"; id="${id: -8}"
nsa="ttpeer${id}a"; nsb="ttpeer${id}b"
deva="tpa${id}"; devb="tpb${id}"          # <= 11 chars (IFNAMSIZ 16)
work="$(mktemp -d /tmp/ttpeer-smoke.XXXXXX)"
fpid=""

cleanup() {
    set +e
    if [[ -n "$fpid" ]] && kill -0 "$fpid" 2>/dev/null; then
        kill -TERM "$fpid" 2>/dev/null; sleep 0.5; kill -KILL "$fpid" 2>/dev/null
    fi
    [[ -f "$work/iperf.pid" ]] && kill "$(cat "$work/iperf.pid")" 2>/dev/null
    ip netns del "$nsa" 2>/dev/null; ip netns del "$nsb" 2>/dev/null
    ip link del "$deva" 2>/dev/null; ip link del "$devb" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() { echo "smoke.sh [$mode]: FAIL: $*" >&2; [[ -s "$work/fwd.err" ]] && sed 's/^/  fwd stderr: /' "$work/fwd.err" >&2; exit 1; }

ip netns add "$nsa"; ip netns add "$nsb"

"$fwd" "$deva" "$devb" --mode "$mode" >"$work/fwd.out" 2>"$work/fwd.err" &
fpid=$!
for _ in $(seq 100); do
    grep -qx ready "$work/fwd.out" 2>/dev/null && break
    kill -0 "$fpid" 2>/dev/null || fail "forwarder exited before ready"
    sleep 0.1
done
grep -qx ready "$work/fwd.out" || fail "no ready line within 10 s"

ip link set dev "$deva" netns "$nsa"
ip link set dev "$devb" netns "$nsb"

setup_ns() { # NS DEV ADDR PEER_NET
    local ns="$1" dev="$2" addr="$3" peer="$4"
    ip netns exec "$ns" sh -c "
        sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
        sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 net.ipv4.conf.$dev.rp_filter=0
        ip link set lo up
        ip addr add $addr dev $dev
        ip link set dev $dev up
        ip route add $peer dev $dev"
}
setup_ns "$nsa" "$deva" 10.0.1.1/24 10.0.2.0/24
# B is still down: this packet reaches the forwarder, whose write to B must fail with EIO and be
# counted as a drop without stopping it (the transient state of every bench setup).
ip netns exec "$nsa" ping -c 1 -W 1 -q 10.0.2.1 >/dev/null 2>&1 || true
kill -0 "$fpid" 2>/dev/null || fail "forwarder died on a write to a down device"
setup_ns "$nsb" "$devb" 10.0.2.1/24 10.0.1.0/24

ping_res="no ping"
if command -v ping >/dev/null; then
    ip netns exec "$nsa" ping -c 3 -i 0.2 -W 2 -q -I 10.0.1.1 10.0.2.1 >"$work/ping" 2>&1 || { cat "$work/ping" >&2; fail "ping across the forwarder failed"; }
    ping_res="ping ok ($(grep -o '[0-9]* received' "$work/ping"))"
fi

ip netns exec "$nsb" iperf3 -s -B 10.0.2.1 -1 -D -I "$work/iperf.pid"
for _ in $(seq 50); do
    ip netns exec "$nsb" sh -c 'cat /proc/net/tcp' | grep -q ':1451 00000000:0000 0A' && break  # 5201 LISTEN
    sleep 0.1
done
ip netns exec "$nsa" iperf3 -c 10.0.2.1 -B 10.0.1.1 -t "$secs" -C cubic -J >"$work/iperf.json" 2>&1 \
    || { tail -5 "$work/iperf.json" >&2; fail "iperf3 failed"; }
gbps=$(jq -r '.end.sum_received.bits_per_second / 1e9 * 100 | round / 100' "$work/iperf.json")
retr=$(jq -r '.end.sum_sent.retransmits' "$work/iperf.json")
cc=$(jq -r '.end.sender_tcp_congestion // "?"' "$work/iperf.json")

kill -TERM "$fpid"
rc=0; wait "$fpid" || rc=$?
fpid=""
[[ $rc == 0 ]] || fail "forwarder exited $rc after SIGTERM"
counters=$(grep -v -x ready "$work/fwd.out" | tail -1)
echo "$counters" | jq -e 'has("packets") and has("bytes") and has("drops") and has("errors")' >/dev/null \
    || fail "last stdout line is not the JSON counters: $counters"
[[ $(grep -c . "$work/fwd.out") == 2 ]] || fail "stdout should be exactly 'ready' + one JSON line"

echo "$(basename "$fwd") $mode: ${gbps} Gbps, retr $retr, cc $cc, $ping_res, counters $counters"
