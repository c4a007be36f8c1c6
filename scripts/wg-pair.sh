# Sourced by the scripts that measure two `turbotun wg` endpoints (wg-soak.sh, tunnel-syscalls.sh): two private
# namespaces A and B joined by a veth underlay (10.201.0.1 and .2), an endpoint in each with a fresh key pair,
# each the other's peer, tunnel addresses 10.202.0.1 and .2 at MTU 1420. Removes all of it on exit.
# Usage: wg_pair_up TURBOTUN PREFIX PORT   (PORT for A, PORT+1 for B)
# Sets: a b (namespaces), wa wb (devices), pa pb (endpoint pids), dir (a private directory with a.out, b.out).
wg_pair_up() {
    local turbotun=$1 prefix=$2 port=$3 tag=$$
    a=${prefix}a$tag b=${prefix}b$tag wa=${prefix}wa$tag wb=${prefix}wb$tag
    dir=$(mktemp -d)
    trap wg_pair_down EXIT
    ip netns add "$a"; ip netns add "$b"
    ip link add "ul$tag" netns "$a" type veth peer name "ur$tag" netns "$b"
    ip -n "$a" addr add 10.201.0.1/24 dev "ul$tag"; ip -n "$a" link set "ul$tag" up; ip -n "$a" link set lo up
    ip -n "$b" addr add 10.201.0.2/24 dev "ur$tag"; ip -n "$b" link set "ur$tag" up; ip -n "$b" link set lo up
    ip netns exec "$a" "$turbotun" wg -f --json "$wa" >"$dir/a.out" 2>"$dir/a.err" & pa=$!
    ip netns exec "$b" "$turbotun" wg -f --json "$wb" >"$dir/b.out" 2>"$dir/b.err" & pb=$!
    for _ in $(seq 50); do
        [[ -S /var/run/wireguard/$wa.sock && -S /var/run/wireguard/$wb.sock ]] && break
        sleep 0.1
    done
    wg genkey >"$dir/ka"; wg genkey >"$dir/kb"
    ip netns exec "$a" wg set "$wa" private-key "$dir/ka" listen-port "$port" \
        peer "$(wg pubkey <"$dir/kb")" endpoint "10.201.0.2:$((port + 1))" allowed-ips 10.202.0.2/32
    ip netns exec "$b" wg set "$wb" private-key "$dir/kb" listen-port "$((port + 1))" \
        peer "$(wg pubkey <"$dir/ka")" endpoint "10.201.0.1:$port" allowed-ips 10.202.0.1/32
    ip -n "$a" addr add 10.202.0.1/24 dev "$wa"; ip -n "$a" link set "$wa" mtu 1420 up
    ip -n "$b" addr add 10.202.0.2/24 dev "$wb"; ip -n "$b" link set "$wb" mtu 1420 up
}

wg_pair_down() {
    for ns in $a $b; do ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true; done
    sleep 0.5
    ip netns del "$a" 2>/dev/null || true
    ip netns del "$b" 2>/dev/null || true
    rm -rf "$dir" "/var/run/wireguard/$wa.sock" "/var/run/wireguard/$wb.sock"
}
