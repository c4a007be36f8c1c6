#!/usr/bin/env bash
# What `turbotun fwd --gro-hold USECS` adds to a packet's time when nothing else is queued (the worst case: every
# read finds the queue dry and waits the whole hold), measured as ping round trips through the bench's topology:
# the forwarder creates two TUN devices in a namespace of its own, one is moved to namespace A (10.0.1.1/24), the
# other to B (10.0.2.1/24), and A pings B through it. Each hold is run in turn, ROUNDS times, interleaved.
# Usage: scripts/gro-hold-latency.sh TURBOTUN [ROUNDS [COUNT]]   (e.g. target/release/turbotun 5 200)
# Prints, per hold, the median over rounds of ping's average and of its maximum round trip, in microseconds.
set -euo pipefail
turbotun=$(realpath "$1") rounds=${2:-5} count=${3:-200}
tag=$$ f=ghf$$ a=gha$$ b=ghb$$ da=gha$$x db=ghb$$y
dir=$(mktemp -d)
pid=
down() {
    [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    for ns in "$f" "$a" "$b"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$dir"
}
trap down EXIT
trap 'exit 130' INT TERM
ip netns add "$a"; ip netns add "$b"
ip -n "$a" link set lo up; ip -n "$b" link set lo up

# One forwarder run: the ping's average and maximum RTT (µs) through a forwarder with `--gro-hold HOLD` (0: none).
one_run() {
    local hold=$1 args=()
    [[ $hold != 0 ]] && args=(--gro-hold "$hold")
    ip netns add "$f"
    ip netns exec "$f" "$turbotun" fwd "$da" "$db" --mode offload "${args[@]}" >"$dir/fwd.out" 2>"$dir/fwd.err" &
    pid=$!
    for _ in $(seq 100); do grep -q ready "$dir/fwd.out" 2>/dev/null && break; sleep 0.05; done
    grep -q ready "$dir/fwd.out" || { cat "$dir/fwd.err" >&2; exit 1; }
    ip -n "$f" link set "$da" netns "$a"; ip -n "$f" link set "$db" netns "$b"
    ip -n "$a" addr add 10.0.1.1/24 dev "$da"; ip -n "$a" link set "$da" up
    ip -n "$a" route add 10.0.2.0/24 dev "$da"
    ip -n "$b" addr add 10.0.2.1/24 dev "$db"; ip -n "$b" link set "$db" up
    ip -n "$b" route add 10.0.1.0/24 dev "$db"
    ip netns exec "$a" ping -q -c 5 -i 0.05 -w 10 10.0.2.1 >/dev/null
    # rtt min/avg/max/mdev = 0.031/0.045/0.101/0.010 ms
    ip netns exec "$a" ping -q -n -c "$count" -i 0.005 10.0.2.1 | awk -F'[/ =]+' '/^rtt/ {
        printf "%.0f %.0f\n", $7 * 1000, $8 * 1000 }'
    kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
    ip netns del "$f"
}

holds=(0 100 1000)
for round in $(seq "$rounds"); do
    for hold in "${holds[@]}"; do
        echo "$hold $(one_run "$hold")" >>"$dir/runs"
    done
done
echo "hold_us  avg RTT µs: median (min-max) over $rounds rounds  max RTT µs: median"
for hold in "${holds[@]}"; do
    avg=$(awk -v h="$hold" '$1 == h { print $2 }' "$dir/runs" | sort -n | tr '\n' ' ')
    max=$(awk -v h="$hold" '$1 == h { print $3 }' "$dir/runs" | sort -n | tr '\n' ' ')
    echo "$hold $avg | $max" | awk '{ n = (NF - 2) / 2; printf "%7s  %s (%s-%s)  %s\n", $1, $(1 + int((n + 1) / 2)), $2, $(1 + n), $(3 + n + int((n + 1) / 2) - 1) }'
done
