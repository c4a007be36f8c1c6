#!/usr/bin/env bash
# Build the benchmark peers into bench/peers/bin/:
#   bin/tunrs-fwd  (tun-rs 2.8, Rust, release)      bin/wggo-fwd  (wireguard-go tun package, Go)
# Idempotent: a binary newer than all of its sources is left alone (FORCE=1 rebuilds anyway).
# Usage: bench/peers/build.sh [tunrs|wggo]...   (default: both)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$here/bin"
mkdir -p "$bin"

die() { echo "bench/peers/build.sh: $*" >&2; exit 1; }

# Toolchains installed the usual way may be off PATH (sudo, CI): look in their default places too.
for d in "${CARGO_HOME:-$HOME/.cargo}/bin" /usr/local/go/bin; do
    [[ -d "$d" && ":$PATH:" != *":$d:"* ]] && PATH="$PATH:$d"
done
export PATH

# up_to_date BINARY SRC... : true when BINARY exists and no SRC file is newer than it.
up_to_date() {
    local out="$1"; shift
    [[ "${FORCE:-0}" != 1 && -x "$out" ]] || return 1
    [[ -z "$(find "$@" -type f -newer "$out" -print -quit 2>/dev/null)" ]]
}

build_tunrs() {
    local dir="$here/tunrs-fwd" out="$bin/tunrs-fwd"
    if up_to_date "$out" "$dir/Cargo.toml" "$dir/Cargo.lock" "$dir/src"; then
        echo "tunrs-fwd: up to date ($out)" >&2; return 0
    fi
    command -v cargo >/dev/null 2>&1 || die "cargo not found: install a Rust toolchain (https://rustup.rs) to build the tun-rs peer"
    echo "tunrs-fwd: building (cargo build --release, nice)..." >&2
    (cd "$dir" && CARGO_TARGET_DIR="$dir/target" nice -n 15 cargo build --release --locked --quiet) \
        || die "tunrs-fwd: cargo build failed"
    install -m 0755 "$dir/target/release/tunrs-fwd" "$out.tmp" && mv -f "$out.tmp" "$out"
    echo "tunrs-fwd: built $out" >&2
}

build_wggo() {
    local dir="$here/wggo-fwd" out="$bin/wggo-fwd"
    if up_to_date "$out" "$dir/go.mod" "$dir/go.sum" $(find "$dir" -maxdepth 1 -name '*.go'); then
        echo "wggo-fwd: up to date ($out)" >&2; return 0
    fi
    command -v go >/dev/null 2>&1 || die "go not found: \`apt-get install golang-go\` to build the wireguard-go peer"
    echo "wggo-fwd: building (go build, nice)..." >&2
    (cd "$dir" && nice -n 15 go build -mod=readonly -trimpath -buildvcs=false -o "$out.tmp" .) \
        || die "wggo-fwd: go build failed"
    mv -f "$out.tmp" "$out"
    echo "wggo-fwd: built $out" >&2
}

targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(tunrs wggo)
for t in "${targets[@]}"; do
    case "$t" in
        tunrs|tunrs-fwd) build_tunrs ;;
        wggo|wggo-fwd) build_wggo ;;
        *) die "unknown peer '$t' (known: tunrs, wggo)" ;;
    esac
done
