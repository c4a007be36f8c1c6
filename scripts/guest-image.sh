#!/usr/bin/env bash
# Builds the small Linux guest the QEMU vhost-user test boots: OUTDIR/vmlinuz (Debian's linux-image-amd64) and
# OUTDIR/initramfs.cpio.gz (busybox-static, the virtio-net driver's modules, scripts/guest/init as /init).
# Downloads the kernel package with apt-get on first use; does nothing when OUTDIR holds an image made from the same
# kernel package, busybox and init script. Needs apt-get (and root, only to run `apt-get update` when apt has no
# lists), dpkg-deb, busybox-static and cpio (scripts/install-deps.sh).
set -euo pipefail

out=${1:?usage: scripts/guest-image.sh OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
init=$here/guest/init
busybox=/bin/busybox
# The modules the guest loads, with every module they depend on before them; built-in ones are skipped.
wanted=(virtio_pci virtio_net)

for tool in apt-get apt-cache dpkg-deb cpio gzip; do
    command -v "$tool" >/dev/null || { echo "guest-image: $tool is missing (scripts/install-deps.sh)" >&2; exit 1; }
done
# All of the list is read: `grep -q` would stop at the match, and busybox's SIGPIPE then fails the pipeline.
[[ -x $busybox ]] && "$busybox" --list | grep -x nc >/dev/null ||
    { echo "guest-image: $busybox (busybox-static) is missing (scripts/install-deps.sh)" >&2; exit 1; }

kernel_package=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)$/\1/p' | head -n 1)
if [[ -z $kernel_package ]]; then
    apt-get update -qq
    kernel_package=$(apt-cache depends linux-image-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)$/\1/p' | head -n 1)
fi
[[ -n $kernel_package ]] || { echo "guest-image: apt knows no linux-image-amd64" >&2; exit 1; }

stamp="$kernel_package $(sha256sum "$init" "$busybox" "$0" | cut -d' ' -f1 | tr '\n' ' ')"
if [[ -s $out/vmlinuz && -s $out/initramfs.cpio.gz && "$(cat "$out/stamp" 2>/dev/null)" == "$stamp" ]]; then
    exit 0
fi

mkdir -p "$out"
work=$(mktemp -d "$out/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "guest-image: building from $kernel_package into $out" >&2
(cd "$work" && apt-get download -qq "$kernel_package" 2>/dev/null)
dpkg-deb -x "$work"/linux-image-*.deb "$work/kernel"
moddir=$(echo "$work"/kernel/lib/modules/*)

root=$work/root
mkdir -p "$root/bin" "$root/modules"
cp "$busybox" "$root/bin/busybox"
cp "$init" "$root/init"
chmod 0755 "$root/init" "$root/bin/busybox"
: >"$root/modules.order"
declare -A loaded=()
# Puts MODULE's dependencies (the `depends=` record in its .modinfo), then MODULE, in the initramfs and its order.
add_module() {
    local module=$1 file dependency
    [[ -z ${loaded[$module]:-} ]] || return 0
    loaded[$module]=1
    grep -q "/$module.ko" "$moddir/modules.builtin" 2>/dev/null && return 0
    file=$(find "$moddir/kernel" \( -name "$module.ko" -o -name "$module.ko.xz" -o -name "$module.ko.zst" \) | head -n 1)
    [[ -n $file ]] || { echo "guest-image: $kernel_package has no module $module" >&2; exit 1; }
    # busybox's insmod loads plain ELF modules only.
    case $file in
        *.xz) xz -dc "$file" >"$root/modules/$module.ko" ;;
        *.zst) zstd -qdc "$file" >"$root/modules/$module.ko" ;;
        *) cp "$file" "$root/modules/$module.ko" ;;
    esac
    for dependency in $(tr '\0' '\n' <"$root/modules/$module.ko" | sed -n 's/^depends=//p' | tr ',' ' '); do
        add_module "${dependency//-/_}"
    done
    echo "$module" >>"$root/modules.order"
}
for module in "${wanted[@]}"; do
    add_module "$module"
done

(cd "$root" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0) | gzip -9n >"$work/initramfs.cpio.gz"
cp "$work"/kernel/boot/vmlinuz-* "$work/vmlinuz"
mv "$work/vmlinuz" "$work/initramfs.cpio.gz" "$out/"
echo "$stamp" >"$out/stamp"
