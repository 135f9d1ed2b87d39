#!/usr/bin/env bash
# CI only: what tests/test_aarch64.py needs to build kvcore's native core for
# aarch64 and run it under qemu-user (every other CPU takes the portable code):
# the cross compiler and qemu (amd64 packages), and the arm64 builds of the
# libraries the core links, unpacked into build/aarch64-sysroot (libisal's arm64
# and amd64 packages cannot be installed side by side).
set -euo pipefail
cd "$(dirname "$0")/.."
sudo_if_needed() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
export DEBIAN_FRONTEND=noninteractive
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    sudo_if_needed dpkg --add-architecture arm64
fi
sudo_if_needed apt-get update -qq
sudo_if_needed apt-get install -y -qq --no-install-recommends g++-aarch64-linux-gnu qemu-user >/dev/null
sysroot=build/aarch64-sysroot
rm -rf "$sysroot" && mkdir -p "$sysroot/debs"
(cd "$sysroot/debs" && apt-get download -q libzstd1:arm64 libzstd-dev:arm64 libxxhash0:arm64 libxxhash-dev:arm64 \
    libisal2:arm64 libisal-dev:arm64 >/dev/null)
for deb in "$sysroot"/debs/*.deb; do dpkg-deb -x "$deb" "$sysroot"; done
rm -rf "$sysroot/debs"
