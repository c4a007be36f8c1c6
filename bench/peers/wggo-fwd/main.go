// Command wggo-fwd is a benchmark peer for `turbotun bench`: it forwards IP packets between two
// TUN devices with wireguard-go's tun package (golang.zx2c4.com/wireguard/tun), the TUN layer
// wireguard-go itself runs on.
//
//	wggo-fwd DEV_A DEV_B --mode plain|offload
//
// Process contract (docs/CONTRACTS.md, "Forwarder processes"): create both TUN devices by name (no
// addresses, not brought up), print `ready`, forward A<->B until SIGINT/SIGTERM, then print one
// JSON line of counters and exit 0. A write that fails with EIO (device down, e.g. while the bench
// moves it into its namespace) is counted as a drop; ENODEV/EBADFD or a read error is fatal (cause
// on stderr, exit 1).
//
// Modes (one goroutine per direction, like wireguard-go's RoutineReadFromTUN):
//   - offload: tun.CreateTUN(name, 1500), which opens the device with IFF_VNET_HDR and enables
//     TSO (and USO where the kernel has it); Device.Read splits GSO super-packets into up to
//     BatchSize() (128) packets and Device.Write coalesces them again (GRO) before writing.
//   - plain: the device is opened here with IFF_TUN|IFF_NO_PI only (no IFF_VNET_HDR) and wrapped
//     with tun.CreateTUNFromFile, which then sees no vnet header, enables no offload and uses a
//     batch size of 1: one packet per read and per write.
//
// Buffers are 65535 bytes after an offset of 16 bytes of headroom (wireguard-go's device reads
// from the TUN at offset MessageTransportHeaderSize = 16; the tun package needs offset >= 10, the
// virtio-net header length, to write with a vnet header).
package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/tun"
)

const (
	offset    = 16    // headroom before each packet; >= virtio-net header length (10)
	maxPacket = 65535 // largest IP packet
	mtu       = 1500  // MTU given to the tun package (the bench may change it after the move)
)

const usage = "usage: wggo-fwd DEV_A DEV_B --mode plain|offload"

// counters of one direction, padded to their own cache lines.
type counters struct {
	packets atomic.Uint64
	bytes   atomic.Uint64
	drops   atomic.Uint64
	errors  atomic.Uint64
	batches atomic.Uint64
	_       [88]byte
}

func fatalf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "wggo-fwd: "+format+"\n", a...)
	os.Exit(1)
}

func usageExit(msg string) {
	fmt.Fprintf(os.Stderr, "wggo-fwd: %s\n%s\n", msg, usage)
	os.Exit(2)
}

// openPlain creates/attaches the TUN device without IFF_VNET_HDR and hands it to the tun package.
func openPlain(name string) (tun.Device, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("TUNSETIFF %s: %w", name, err)
	}
	// Non-blocking before os.NewFile, so the fd is handed to Go's netpoller (as tun.CreateTUN does).
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return tun.CreateTUNFromFile(os.NewFile(uintptr(fd), "/dev/net/tun"), mtu)
}

// isFatalWrite reports whether a (possibly joined) write error means the device is gone.
func isFatalWrite(err error) bool {
	return errors.Is(err, os.ErrClosed) || errors.Is(err, syscall.ENODEV) ||
		errors.Is(err, syscall.EBADFD) || errors.Is(err, syscall.EBADF)
}

// isFatalRead: an error from the read syscall (or a closed device) is fatal; the tun package's own
// packet-processing errors (bad virtio header, too many segments, ...) carry no errno and are counted.
func isFatalRead(err error) bool {
	if errors.Is(err, os.ErrClosed) {
		return true
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno != syscall.EINTR && errno != syscall.EAGAIN
	}
	return false
}

func forward(src, dst tun.Device, c *counters, dir string) {
	batch := src.BatchSize()
	if b := dst.BatchSize(); b > batch {
		batch = b
	}
	store := make([][]byte, batch) // full-size backing buffers
	bufs := make([][]byte, batch)  // what Read fills
	out := make([][]byte, batch)   // what Write sends: headroom + packet, capacity to coalesce into
	sizes := make([]int, batch)
	for i := range store {
		store[i] = make([]byte, offset+maxPacket)
	}
	for {
		for i := range bufs {
			bufs[i] = store[i]
		}
		n, err := src.Read(bufs, sizes, offset)
		if err != nil {
			if isFatalRead(err) {
				fatalf("read %s: %v", dir, err)
			}
			c.errors.Add(1) // e.g. tun.ErrTooManySegments: the n packets read are still valid
		}
		if n == 0 {
			continue
		}
		var bytes uint64
		for i := 0; i < n; i++ {
			out[i] = store[i][:offset+sizes[i]]
			bytes += uint64(sizes[i])
		}
		c.batches.Add(1)
		if _, err := dst.Write(out[:n], offset); err != nil {
			if isFatalWrite(err) {
				fatalf("write %s: %v", dir, err)
			}
			// Write tries every (coalesced) packet and joins the errors, so which packets of the
			// batch went out is unknown: count the whole batch as dropped.
			c.drops.Add(uint64(n))
			if !errors.Is(err, syscall.EIO) {
				c.errors.Add(1)
			}
			continue
		}
		c.packets.Add(uint64(n))
		c.bytes.Add(bytes)
	}
}

// drainEvents consumes the device's up/down/MTU events (the tun package's listeners block on a
// small channel otherwise).
func drainEvents(dev tun.Device, n *atomic.Uint64) {
	for range dev.Events() {
		n.Add(1)
	}
}

func main() {
	var pos []string
	mode := ""
	args := os.Args[1:]
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--mode":
			if i+1 >= len(args) {
				usageExit("--mode needs a value")
			}
			i++
			mode = args[i]
		case len(a) > 7 && a[:7] == "--mode=":
			mode = a[7:]
		case a == "--threads":
			// Accepted for the common CLI; this peer always runs one goroutine per direction.
			i++
		case a == "-h" || a == "--help":
			fmt.Println(usage)
			os.Exit(0)
		case len(a) > 0 && a[0] == '-':
			usageExit("unknown option " + a)
		default:
			pos = append(pos, a)
		}
	}
	if len(pos) != 2 {
		usageExit("need exactly two device names")
	}
	var open func(string) (tun.Device, error)
	switch mode {
	case "offload":
		open = func(name string) (tun.Device, error) { return tun.CreateTUN(name, mtu) }
	case "plain":
		open = openPlain
	case "":
		usageExit("--mode is required")
	default:
		usageExit("unknown mode " + mode)
	}

	// Catch the signals before the devices exist so none is missed after `ready`.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)

	devA, err := open(pos[0])
	if err != nil {
		fatalf("create %s: %v", pos[0], err)
	}
	devB, err := open(pos[1])
	if err != nil {
		fatalf("create %s: %v", pos[1], err)
	}
	var events atomic.Uint64
	go drainEvents(devA, &events)
	go drainEvents(devB, &events)

	var ab, ba counters
	go forward(devA, devB, &ab, pos[0]+"->"+pos[1])
	go forward(devB, devA, &ba, pos[1]+"->"+pos[0])

	fmt.Fprintf(os.Stderr, "wggo-fwd: mode=%s batch=%d offset=%d\n", mode, devA.BatchSize(), offset)
	fmt.Println("ready")

	sig := <-sigs
	signo := 0
	if s, ok := sig.(syscall.Signal); ok {
		signo = int(s)
	}
	fmt.Printf("{\"packets\":%d,\"bytes\":%d,\"drops\":%d,\"errors\":%d,\"batches\":%d,\"mode\":%q,\"impl\":\"wireguard-go tun\",\"batch_size\":%d,\"events\":%d,\"signal\":%d}\n",
		ab.packets.Load()+ba.packets.Load(),
		ab.bytes.Load()+ba.bytes.Load(),
		ab.drops.Load()+ba.drops.Load(),
		ab.errors.Load()+ba.errors.Load(),
		ab.batches.Load()+ba.batches.Load(),
		mode, devA.BatchSize(), events.Load(), signo)
	// Leave without Close(): the forwarding goroutines are parked in Read; the devices go with the process.
	os.Exit(0)
}
