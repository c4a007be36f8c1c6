#!/bin/sh
# What IPsec-MB's manager maps in, and whether its burst API is faster than one ChaCha20-Poly1305 job per call
# (ipsec-mb-probe.c says how). Run it on a quiet box.
# Usage: scripts/ipsec-mb-probe.sh [ROUNDS]   (needs libipsec-mb-dev, which scripts/install-deps.sh installs)
set -eu
here=$(dirname "$0")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT INT TERM
cc -O2 -Wall -o "$dir/ipsec-mb-probe" "$here/ipsec-mb-probe.c" -lIPSec_MB
"$dir/ipsec-mb-probe" 0 avx512 || echo "init_mb_mgr_avx512: this CPU has no AVX-512 manager"
"$dir/ipsec-mb-probe" "${1:-5}"
