#!/usr/bin/env bash
# CI: make podman usable on this machine and build the tiny harness image the container-backend
# tests use. Run as root. Nothing is pulled: the image comes from a Debian minbase rootfs made
# with debootstrap, cached between runs under $CORRAL_CI_CACHE keyed by a hash of what goes in it.
#
# Prints nothing on success except progress; the image is tagged localhost/corral-ci-harness:latest
# (and :<hash>), which crates/corral/tests/engine_containers.rs uses (ci/docker-setup.sh imports the same rootfs into docker).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

cache=${CORRAL_CI_CACHE:-/var/cache/corral-ci}
mirror=${CORRAL_CI_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
packages="bash,curl,ca-certificates,python3"
image=localhost/corral-ci-harness

need=()
for bin in podman runc catatonit netavark debootstrap; do
    command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/lib/podman/$bin" ] || need+=("$bin")
done
if [ ${#need[@]} -gt 0 ] || ! dpkg -s aardvark-dns python3-venv >/dev/null 2>&1; then
    echo "ci/podman-setup.sh: installing podman runc netavark aardvark-dns debootstrap python3-venv"
    apt-get install -y -qq --no-install-recommends \
        podman runc catatonit netavark aardvark-dns debootstrap uidmap python3-venv >/dev/null
fi

# This machine's cgroups are hybrid v1 (crun refuses them) and its default ulimits cannot be
# raised: runc, cgroupfs and explicit ulimits, for CI only. corral itself passes none of these.
mkdir -p /etc/containers
hard_nofile=$(ulimit -Hn)
hard_nproc=$(ulimit -Hu)
[ "$hard_nofile" = unlimited ] && hard_nofile=1048576
[ "$hard_nproc" = unlimited ] && hard_nproc=16384
# Values above the machine's own (lower, invisible) cap make runc fail with "error setting rlimit".
[ "$hard_nproc" -gt 16384 ] && hard_nproc=16384
[ "$hard_nofile" -gt 65536 ] && hard_nofile=65536
cat >/etc/containers/containers.conf <<CONF
# Written by corral's ci/podman-setup.sh.
[containers]
default_ulimits = ["nofile=${hard_nofile}:${hard_nofile}", "nproc=${hard_nproc}:${hard_nproc}"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"

[network]
network_backend = "netavark"
CONF

# podman-compose from PyPI: Debian 12's 1.0.3 rejects a service's `networks:` mapping with
# aliases (seed 003's shape). In a venv, so nothing of the system's Python changes.
venv=${CORRAL_CI_VENV:-/opt/corral-ci-venv}
if ! [ -x "$venv/bin/podman-compose" ]; then
    echo "ci/podman-setup.sh: installing podman-compose into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q 'podman-compose==1.6.0'
fi

key=$(printf '%s\n' "$suite" "$packages" "$mirror" v2 | sha256sum | cut -c1-16)
tarball="$cache/rootfs-$key.tar"
if ! [ -s "$tarball" ]; then
    echo "ci/podman-setup.sh: building the rootfs ($suite minbase + $packages) into $tarball"
    mkdir -p "$cache"
    root=$(mktemp -d "$cache/rootfs.XXXXXX")
    trap 'rm -rf "$root"' EXIT
    debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror" >"$cache/debootstrap.log" 2>&1 \
        || { tail -20 "$cache/debootstrap.log"; exit 1; }
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    chmod 755 "$root"  # mktemp made it 0700: non-root users in the container could not traverse /
    tar -C "$root" --numeric-owner -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    find "$cache" -maxdepth 1 -name 'rootfs-*.tar' ! -name "rootfs-$key.tar" -delete
    rm -rf "$root"
    trap - EXIT
fi

if ! podman image exists "$image:$key"; then
    echo "ci/podman-setup.sh: importing $tarball as $image:$key"
    podman import --change 'CMD ["/bin/bash"]' "$tarball" "$image:$key" >/dev/null
fi
podman tag "$image:$key" "$image:latest"
echo "ci/podman-setup.sh: $image:latest ready ($(podman --version), $(podman info --format '{{.Host.NetworkBackend}}'))"
