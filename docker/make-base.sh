#!/usr/bin/env bash
# Build the Docker base image of mlmt-bench from Debian packages alone, for a machine that
# cannot pull from Docker Hub (behind a mirror, or offline but for a Debian mirror).
#
#   sudo docker/make-base.sh                      # -> image mlmt-base:bookworm
#   docker build --build-arg BASE_IMAGE=mlmt-base:bookworm --target cpu -t mlmt-bench:cpu .
#
# It runs `debootstrap --variant=minbase bookworm` into a temporary directory, adds Debian's
# Python 3.11 (python3, python3-venv for the image's virtual environment, ca-certificates for
# HTTPS to the package index) and imports the tree with `docker import`. Needs root,
# debootstrap and a running Docker engine. Settings (environment variables):
#   DEBIAN_MIRROR  Debian mirror (default: the first deb.debian.org-style URI in this machine's
#                  apt sources, else http://deb.debian.org/debian)
#   SUITE          Debian release (default bookworm: its python3 is 3.11, as the project needs)
#   BASE_TAG       name of the image made (default mlmt-base:$SUITE)
#   WORK_DIR       where the root file system is built (default: a new temporary directory,
#                  removed at the end; it takes about 300 MB)
set -euo pipefail

SUITE=${SUITE:-bookworm}
BASE_TAG=${BASE_TAG:-mlmt-base:$SUITE}

# The host's own Debian mirror, when apt here already uses one (deb822 or one-line sources).
host_mirror() {
    local f
    for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -r "$f" ] || continue
        # deb822 "URIs: X" or one-line "deb X suite ...", the first URI that serves Debian's main archive
        sed -n -e 's/^URIs:[[:space:]]*\([^[:space:]]*\/debian\/\{0,1\}\)$/\1/p' \
               -e 's/^deb[[:space:]]\{1,\}\(\[[^]]*\][[:space:]]\{1,\}\)\{0,1\}\([^[:space:]]*\/debian\/\{0,1\}\)[[:space:]].*/\2/p' "$f"
    done | head -n 1
}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-$(host_mirror)}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

for tool in debootstrap docker tar; do
    command -v "$tool" >/dev/null || { echo "error: $tool is not installed (apt-get install debootstrap docker.io)" >&2; exit 2; }
done
[ "$(id -u)" = 0 ] || { echo "error: debootstrap needs root" >&2; exit 2; }

own_work_dir=0
if [ -z "${WORK_DIR:-}" ]; then
    WORK_DIR=$(mktemp -d /var/tmp/mlmt-base.XXXXXX)
    own_work_dir=1
fi
ROOTFS=$WORK_DIR/rootfs
cleanup() { [ "$own_work_dir" = 1 ] && rm -rf "$WORK_DIR"; }
trap cleanup EXIT

echo "debootstrap $SUITE from $DEBIAN_MIRROR into $ROOTFS"
debootstrap --variant=minbase "$SUITE" "$ROOTFS" "$DEBIAN_MIRROR"

# Python and certificates, then nothing the image does not need at run time (apt's lists and
# caches, man pages, docs).
chroot "$ROOTFS" /usr/bin/env DEBIAN_FRONTEND=noninteractive /bin/sh -ec '
    apt-get update
    apt-get install -y --no-install-recommends python3 python3-venv ca-certificates
    apt-get clean
    rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/* /usr/share/info/*
'
chroot "$ROOTFS" python3 --version

tar --numeric-owner -C "$ROOTFS" -c . \
    | docker import \
        --change 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/bash"]' \
        - "$BASE_TAG"
docker image ls "$BASE_TAG"
