#!/usr/bin/env python3
"""Whether MSG_ZEROCOPY saves the plain tunnel's UDP send copy on this machine's bench topology: UDP GSO
super-packets (64 segments of 1420 bytes) sent from one private namespace to a socket in another over a veth, with
and without MSG_ZEROCOPY, interleaved ROUNDS times. Prints per mode the sender's CPU (user + system) per GB, and for
zerocopy how many completions the kernel marked SO_EE_CODE_ZEROCOPY_COPIED (it copied after all: the data was
delivered to a local socket, as every tunnel endpoint's UDP socket on this box is).

Usage (root): scripts/udp-zerocopy-veth.py [ROUNDS [SECONDS]]
"""
import ctypes, os, resource, socket, struct, subprocess, sys, time

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
SECONDS = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
SEG, SEGS = 1420, 44  # 44 * 1420 = 62480 bytes per send, under the 64 KiB datagram limit
UDP_SEGMENT, SO_ZEROCOPY, MSG_ZEROCOPY = 103, 60, 0x4000000
SO_EE_ORIGIN_ZEROCOPY, SO_EE_CODE_ZEROCOPY_COPIED = 5, 1
tag = str(os.getpid())
A, B = "zca" + tag, "zcb" + tag


def sh(*args):
    subprocess.run(args, check=True)


LIBC = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNET = 0x40000000


def setns(name):
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    if LIBC.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), f"setns {name}")
    os.close(fd)


def sink():
    """In B: a UDP socket read until the parent closes the pipe."""
    setns(B)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.bind(("10.203.0.2", 9000))
    s.settimeout(0.5)
    while True:
        try:
            s.recv(65536)
        except socket.timeout:
            if os.getppid() == 1:
                os._exit(0)


def drain_completions(s, pending):
    """Reads zerocopy completions off the error queue; returns (ranges done, how many of them were copied)."""
    done = copied = 0
    while True:
        try:
            _, anc, _, _ = s.recvmsg(0, 256, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return done, copied
        for level, kind, data in anc:
            if len(data) >= 16:
                errno_, origin, type_, code, _pad, info, data_hi = struct.unpack("=IBBBBII", data[:16])
                if origin == SO_EE_ORIGIN_ZEROCOPY:
                    n = data_hi - info + 1
                    done += n
                    if code & SO_EE_CODE_ZEROCOPY_COPIED:
                        copied += n


def run(zerocopy):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_UDP, UDP_SEGMENT, SEG)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    if zerocopy:
        s.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
    s.connect(("10.203.0.2", 9000))
    bufs = [bytearray(os.urandom(SEG * SEGS)) for _ in range(64)]
    sent = completed = copied = 0
    start_cpu = resource.getrusage(resource.RUSAGE_SELF)
    end = time.monotonic() + SECONDS
    i = 0
    while time.monotonic() < end:
        # A buffer is reused only once the kernel released it (at most 64 sends in flight).
        while zerocopy and sent - completed >= len(bufs):
            d, c = drain_completions(s, sent - completed)
            completed += d
            copied += c
        try:
            s.send(bufs[i % len(bufs)], MSG_ZEROCOPY if zerocopy else 0)
        except (BlockingIOError, OSError):
            continue
        sent += 1
        i += 1
    if zerocopy:
        deadline = time.monotonic() + 2
        while completed < sent and time.monotonic() < deadline:
            d, c = drain_completions(s, sent - completed)
            completed += d
            copied += c
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    secs = (cpu.ru_utime - start_cpu.ru_utime) + (cpu.ru_stime - start_cpu.ru_stime)
    gb = sent * SEG * SEGS / 1e9
    s.close()
    return secs / gb, gb / SECONDS * 8, completed, copied


def main():
    sh("ip", "netns", "add", A)
    sh("ip", "netns", "add", B)
    try:
        sh("ip", "link", "add", "zc" + tag, "netns", A, "type", "veth", "peer", "name", "zd" + tag, "netns", B)
        for ns, dev, addr in ((A, "zc" + tag, "10.203.0.1/24"), (B, "zd" + tag, "10.203.0.2/24")):
            sh("ip", "-n", ns, "addr", "add", addr, "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
        pid = os.fork()
        if pid == 0:
            try:
                sink()
            finally:
                os._exit(0)
        setns(A)
        rows = {False: [], True: []}
        for _ in range(ROUNDS):
            for zc in (False, True):
                rows[zc].append(run(zc))
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        for zc in (False, True):
            r = sorted(rows[zc])
            mid = r[len(r) // 2]
            label = "MSG_ZEROCOPY" if zc else "copy"
            extra = f", completions {mid[2]}, of them copied by the kernel {mid[3]}" if zc else ""
            print(f"{label}: sender CPU-s per GB {mid[0]:.3f} (min {r[0][0]:.3f}, max {r[-1][0]:.3f}), {mid[1]:.1f} Gbps sent{extra}")
    finally:
        subprocess.run(["ip", "netns", "del", A])
        subprocess.run(["ip", "netns", "del", B])


main()
