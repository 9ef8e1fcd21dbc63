#!/usr/bin/env bash
# CI: make docker usable on this machine for the container-backend tests: Debian's docker.io
# (dockerd, containerd, runc) and docker-compose, dockerd started in the background when it is not
# running, and the same harness image podman uses (ci/podman-setup.sh builds the rootfs first),
# imported as localhost/corral-ci-harness:latest. Run as root. Nothing is pulled from a registry.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

cache=${CORRAL_CI_CACHE:-/var/cache/corral-ci}
image=localhost/corral-ci-harness

if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker-compose >/dev/null 2>&1; then
    echo "ci/docker-setup.sh: installing docker.io and docker-compose"
    apt-get install -y -qq --no-install-recommends docker.io docker-compose >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
    echo "ci/docker-setup.sh: starting dockerd (log: $cache/dockerd.log)"
    mkdir -p "$cache"
    # setsid: dockerd outlives this script and is not in CI's process group; CI's machine is
    # discarded afterwards.
    setsid dockerd >"$cache/dockerd.log" 2>&1 </dev/null &
    for _ in $(seq 60); do
        docker info >/dev/null 2>&1 && break
        sleep 1
    done
    docker info >/dev/null 2>&1 || { tail -20 "$cache/dockerd.log"; exit 1; }
fi

# dockerd sets the FORWARD chain's policy to DROP when it turned IP forwarding on itself. With
# bridge netfilter on (built into this kernel), frames between two containers on one podman
# bridge go through FORWARD too, and netavark adds no ACCEPT for an internal network: the
# podman harness could not reach its compose executor. Accept bridged frames only (traffic
# between networks is routed, not bridged, so docker's and podman's isolation stay).
if ! iptables -C DOCKER-USER -m physdev --physdev-is-bridged -j ACCEPT 2>/dev/null; then
    iptables -I DOCKER-USER -m physdev --physdev-is-bridged -j ACCEPT
fi

tarball=$(ls -t "$cache"/rootfs-*.tar 2>/dev/null | head -1)
[ -n "$tarball" ] || { echo "ci/docker-setup.sh: no rootfs in $cache: run ci/podman-setup.sh first" >&2; exit 1; }
key=$(basename "$tarball" .tar); key=${key#rootfs-}
if ! docker image inspect "$image:$key" >/dev/null 2>&1; then
    echo "ci/docker-setup.sh: importing $tarball as $image:$key"
    docker import --change 'CMD ["/bin/bash"]' "$tarball" "$image:$key" >/dev/null
fi
docker tag "$image:$key" "$image:latest"
echo "ci/docker-setup.sh: $image:latest ready ($(docker version --format 'server {{.Server.Version}}'))"
