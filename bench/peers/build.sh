#!/usr/bin/env bash
# Build the benchmark peers into bench/peers/bin/:
#   bin/tunrs-fwd  (tun-rs 2.8, Rust, release)      bin/wggo-fwd  (wireguard-go tun package, Go)
# and the tunnel peers of `turbotun bench --tunnel`, released programs built from their published sources:
#   bin/wireguard-go  (go install golang.zx2c4.com/wireguard@$WIREGUARD_GO_VERSION)
#   bin/boringtun-cli (cargo install boringtun-cli --version $BORINGTUN_VERSION --locked)
#   bin/gotatun       (cargo install gotatun-cli --version $GOTATUN_VERSION --locked: Mullvad's GotaTun)
# Idempotent: a binary newer than all of its sources, or built from the pinned version, is left alone (FORCE=1
# rebuilds anyway).
# Usage: bench/peers/build.sh [tunrs|wggo|wireguard-go|boringtun|gotatun]...   (default: tunrs and wggo)
set -euo pipefail

WIREGUARD_GO_VERSION=v0.0.0-20260522210424-ecfc5a8d5446
BORINGTUN_VERSION=0.7.1
GOTATUN_VERSION=0.10.2

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

# pinned BINARY VERSION : true when BINARY exists and was built from VERSION (its stamp file says so).
pinned() {
    [[ "${FORCE:-0}" != 1 && -x "$1" && "$(cat "$1.version" 2>/dev/null)" == "$2" ]]
}

# wireguard-go, the program: `go install` into a GOPATH of its own under bench/peers (module cache writable, so
# that `rm -rf` removes it), then copied to bin/wireguard-go.
build_wireguard_go() {
    local out="$bin/wireguard-go" gopath="$here/gopath"
    if pinned "$out" "$WIREGUARD_GO_VERSION"; then
        echo "wireguard-go: up to date ($out, $WIREGUARD_GO_VERSION)" >&2; return 0
    fi
    command -v go >/dev/null 2>&1 || die "go not found: \`apt-get install golang-go\` to build wireguard-go"
    echo "wireguard-go: building $WIREGUARD_GO_VERSION (go install, nice)..." >&2
    (cd "$here" && GOPATH="$gopath" GOBIN="$gopath/bin" GOFLAGS=-modcacherw \
        nice -n 15 go install -trimpath "golang.zx2c4.com/wireguard@$WIREGUARD_GO_VERSION") \
        || die "wireguard-go: go install failed"
    install -m 0755 "$gopath/bin/wireguard" "$out.tmp" && mv -f "$out.tmp" "$out"
    echo "$WIREGUARD_GO_VERSION" > "$out.version"
    echo "wireguard-go: built $out" >&2
}

# cargo_install_peer CRATE VERSION ROOT BIN OUT : `cargo install CRATE --version VERSION` from crates.io (the
# crate's own Cargo.lock, --locked) with --root ROOT (its target directory under it too), then ROOT/bin/BIN copied
# to OUT with the version written beside it. Skipped when OUT is already of VERSION.
cargo_install_peer() {
    local crate="$1" version="$2" root="$3" name="$4" out="$5"
    if pinned "$out" "$version"; then
        echo "$name: up to date ($out, $version)" >&2; return 0
    fi
    command -v cargo >/dev/null 2>&1 || die "cargo not found: install a Rust toolchain (https://rustup.rs) to build $name"
    echo "$name: building $crate $version (cargo install, nice; a few minutes)..." >&2
    CARGO_TARGET_DIR="$root/target" nice -n 15 cargo install "$crate" --version "$version" \
        --locked --root "$root" --force --quiet \
        || die "$name: cargo install $crate failed"
    install -m 0755 "$root/bin/$name" "$out.tmp" && mv -f "$out.tmp" "$out"
    echo "$version" > "$out.version"
    echo "$name: built $out" >&2
}

# boringtun-cli, under bench/peers/boringtun, copied to bin/boringtun-cli.
build_boringtun() {
    cargo_install_peer boringtun-cli "$BORINGTUN_VERSION" "$here/boringtun" boringtun-cli "$bin/boringtun-cli"
}

# GotaTun (Mullvad's fork of boringtun): the crate gotatun-cli installs the program `gotatun`, under
# bench/peers/gotatun, copied to bin/gotatun.
build_gotatun() {
    cargo_install_peer gotatun-cli "$GOTATUN_VERSION" "$here/gotatun" gotatun "$bin/gotatun"
}

targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(tunrs wggo)
for t in "${targets[@]}"; do
    case "$t" in
        tunrs|tunrs-fwd) build_tunrs ;;
        wggo|wggo-fwd) build_wggo ;;
        wireguard-go) build_wireguard_go ;;
        boringtun|boringtun-cli) build_boringtun ;;
        gotatun|gotatun-cli) build_gotatun ;;
        *) die "unknown peer '$t' (known: tunrs, wggo, wireguard-go, boringtun, gotatun)" ;;
    esac
done
