#!/usr/bin/env bash
# Peak resident memory (VmHWM) of a per-packet program under UDP load: `per-packet-rss.sh PROGRAM`, where PROGRAM
# takes `DEV ADDR/PREFIX` and prints `ready` (examples/per_packet does). Runs in a private network namespace of
# its own (gone when the script ends): 8 seconds of 46-segment UDP GSO bursts (1,400-byte segments) into the
# device, answers drained.
set -euo pipefail
if [[ "${1:-}" != --inside ]]; then
    exec unshare --net "$0" --inside "$@"
fi
program=$2
out=$(mktemp)
trap 'rm -f "$out"; kill "$pid" 2>/dev/null || true' EXIT
ip link set lo up
"$program" ttrss0 10.9.0.1/24 >"$out" 2>&1 &
pid=$!
for _ in $(seq 50); do grep -q ready "$out" && break; sleep 0.1; done
grep -q ready "$out" || { echo "$program did not get ready: $(cat "$out")" >&2; exit 1; }
python3 - <<'PY'
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("10.9.0.1", 0))
s.setblocking(False)
s.setsockopt(socket.IPPROTO_UDP, 103, 1400)  # UDP_SEGMENT
burst, bursts, end = bytes(1400 * 46), 0, time.time() + 8
while time.time() < end:
    try:
        s.sendto(burst, ("10.9.0.2", 9))
        bursts += 1
    except BlockingIOError:
        pass
    try:
        while True:
            s.recv(65536)
    except BlockingIOError:
        pass
print(f"bursts sent: {bursts}")
PY
grep -E "VmHWM|VmRSS" "/proc/$pid/status"
