#!/usr/bin/env bash
# Installs what the tests and the bench need on a fresh Debian machine (run as root). Idempotent: only missing
# tools are installed, so a machine that has them is not touched.
set -euo pipefail

need=()
have() { command -v "$1" >/dev/null 2>&1; }
have ip       || need+=(iproute2)
have iperf3   || need+=(iperf3)
have ethtool  || need+=(ethtool)
have setpriv  || need+=(util-linux)
have perf     || need+=(linux-perf)
have ping     || need+=(iputils-ping)
have arping   || need+=(arping)
# The WireGuard endpoint is driven by the real `wg` and `wg-quick` in the tests and the bench.
have wg       || need+=(wireguard-tools)
have sysctl   || need+=(procps)
# WireGuard's netns selftest (wireguard-go's tests/netns.sh, run against turbotun-wg) uses ncat and a NAT.
have ncat     || need+=(ncat)
have iptables || need+=(iptables)
# DPDK's testpmd is the vhost-user front end of the vhost-user tests: `dpdk-dev` has `dpdk-testpmd` and pulls the
# drivers it loads (virtio-user, the ring mempool, the vdev bus).
have dpdk-testpmd || need+=(dpdk-dev)
# The QEMU vhost-user test boots a guest under QEMU (TCG is enough); scripts/guest-image.sh makes its initramfs
# from busybox-static with cpio, the kernel's modules possibly xz-compressed.
have qemu-system-x86_64 || need+=(qemu-system-x86)
[[ -x /bin/busybox ]] && /bin/busybox --list | grep -x nc >/dev/null || need+=(busybox-static)
have cpio     || need+=(cpio)
have xz       || need+=(xz-utils)
# The completion tests run each shell's script (bash is there already).
have zsh      || need+=(zsh)
have fish     || need+=(fish)
# The WireGuard endpoint's fastest ChaCha20-Poly1305 (`turbotun::aead`: AVX-512, IFMA) is Intel's IPsec-MB, compiled
# against its header when the library is built (without it the build has ring's alone); bench/aead measures it too.
[[ -e /usr/include/intel-ipsec-mb.h ]] || need+=(libipsec-mb-dev)
# The QEMU guest's kernel modules may come zstd-compressed (.ko.zst).
have zstd     || need+=(zstd)
have curl     || need+=(curl ca-certificates)
# `make lint` checks the library's imports with scripts/check-imports.py.
have python3  || need+=(python3)
# The manual pages are checked as `man -l` renders them.
have man      || need+=(man-db)
# PNG charts render their text with DejaVu Sans (SVG charts need no font).
[[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]] || need+=(fonts-dejavu-core)

if ((${#need[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        echo "install-deps: missing packages ${need[*]}; run as root (apt-get install ${need[*]})" >&2
        exit 1
    fi
    echo "install-deps: installing ${need[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! have cargo; then
    if [[ -x "$HOME/.cargo/bin/cargo" ]]; then
        echo "install-deps: cargo is in ~/.cargo/bin but not on PATH; add it: export PATH=\$HOME/.cargo/bin:\$PATH" >&2
    else
        echo "install-deps: cargo (the Rust toolchain) is required: https://rustup.rs" >&2
    fi
    exit 1
fi
# Go builds wireguard-go (the peer of the interoperation tests and the bench) and the wireguard-go forwarder.
# Debian's golang-go is older than their go.mod's `go 1.26.0`: the toolchain comes from the Go module proxy as
# the `go` command itself fetches toolchains (golang.org/toolchain), unpacked into /usr/local/go.
GO_TOOLCHAIN=go1.26.8
if ! have go && [[ ! -x /usr/local/go/bin/go ]]; then
    [[ $(id -u) -eq 0 ]] || { echo "install-deps: go missing; run as root to install $GO_TOOLCHAIN" >&2; exit 1; }
    case $(uname -m) in x86_64) arch=amd64 ;; aarch64) arch=arm64 ;; *) arch=$(uname -m) ;; esac
    module="v0.0.1-$GO_TOOLCHAIN.linux-$arch"
    echo "install-deps: installing $GO_TOOLCHAIN from the Go module proxy into /usr/local/go" >&2
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' EXIT
    curl -fsSL -o "$scratch/go.zip" "${GOPROXY_URL:-https://proxy.golang.org}/golang.org/toolchain/@v/$module.zip"
    python3 -m zipfile -e "$scratch/go.zip" "$scratch/tree"
    # A module zip keeps no file modes: the commands are made executable as cmd/go does.
    root="$scratch/tree/golang.org/toolchain@$module"
    chmod +x "$root"/bin/* "$root"/pkg/tool/*/*
    rm -rf /usr/local/go
    mv "$root" /usr/local/go
    /usr/local/go/bin/go version >&2
fi
exit 0
