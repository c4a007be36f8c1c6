#!/usr/bin/env python3
"""What a UDP GSO send's iovec layout costs the sender: 44 datagrams of 1468 B (a sealed WireGuard run) sent with
UDP_SEGMENT as one iovec per datagram, each at the front of its own 64 KiB buffer (how the tunnel sends them), or as
one contiguous iovec. Loopback, rounds interleaved; prints the sender's system CPU seconds per GB of each layout.
The receiver (UDP_GRO on) drains without copying; its softirq work is the same for both layouts.

Usage: scripts/udp-scatter-loopback.py [ROUNDS] [SECONDS]"""
import resource
import socket
import sys
import time

SEGMENT = 1468
DATAGRAMS = 44
BUFFER = 65600  # the tunnel's per-packet buffer size, rounded
UDP_SEGMENT = 103  # linux/udp.h
UDP_GRO = 104


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.setsockopt(socket.SOL_UDP, UDP_GRO, 1)
    rx.setblocking(False)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.setsockopt(socket.SOL_UDP, UDP_SEGMENT, SEGMENT)
    tx.connect(rx.getsockname())
    arena = memoryview(bytearray(BUFFER * DATAGRAMS))
    scattered = [arena[i * BUFFER + 16:i * BUFFER + 16 + SEGMENT] for i in range(DATAGRAMS)]
    contiguous = [memoryview(bytearray(SEGMENT * DATAGRAMS))]

    def seconds_per_gb(iov):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_stime
        start, sent = time.monotonic(), 0
        while time.monotonic() - start < seconds:
            for _ in range(50):
                sent += tx.sendmsg(iov)
            try:
                while True:
                    rx.recv(1)  # truncated: the receiver is not what is measured
            except BlockingIOError:
                pass
        return (resource.getrusage(resource.RUSAGE_SELF).ru_stime - before) / (sent / 1e9)

    for r in range(rounds):
        a, b = seconds_per_gb(scattered), seconds_per_gb(contiguous)
        print(f"round {r + 1}: sender system s/GB: one iovec per datagram {a:.3f}, contiguous {b:.3f}, "
              f"ratio {a / b:.2f}")


if __name__ == "__main__":
    main()
