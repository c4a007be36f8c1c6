#!/usr/bin/env python3
# UDP load for `turbotun echo`: python3 scripts/udp-flood.py DST SECONDS GSO(0|1), from 10.9.0.1; with GSO each send
# is one UDP_SEGMENT super-packet of 44 x 1400 bytes. Prints datagrams sent and received back.
import socket, sys, time, threading
dst = sys.argv[1]; secs = float(sys.argv[2]); gso = int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("10.9.0.1", 0))
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
if gso:
    s.setsockopt(socket.SOL_UDP, 103, 1400)  # UDP_SEGMENT
    payload = b"x" * (1400 * 44)
else:
    payload = b"x" * 1400
got = [0]
def rx():
    s.settimeout(0.5)
    while True:
        try:
            s.recv(65536)
            got[0] += 1
        except socket.timeout:
            break
t = threading.Thread(target=rx); t.start()
end = time.time() + secs; sent = 0
while time.time() < end:
    try:
        s.sendto(payload, (dst, 9)); sent += len(payload) // 1400
    except (BlockingIOError, OSError):
        pass
t.join()
print(f"sent {sent} datagrams of 1400 bytes in {secs} s ({sent/secs:.0f}/s); {got[0]} received back ({got[0]/secs:.0f}/s)")
