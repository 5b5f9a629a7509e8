#!/usr/bin/env bash
# Build fedsim's base image without a container registry: a Debian bookworm root file system
# from a Debian mirror (debootstrap, minbase variant) with Python 3.11, venv and the CA bundle,
# imported into the local Docker engine. Use it where Docker Hub's python:3.11-slim-bookworm
# cannot be pulled (air-gapped sites), then build the roles on it:
#
#   sudo docker/base/build-base.sh                  # tags fedsim-base:bookworm
#   make images BASE_IMAGE=fedsim-base:bookworm
#
# Needs root, debootstrap and a reachable Debian mirror (MIRROR, default deb.debian.org).
set -euo pipefail
TAG="${1:-fedsim-base:bookworm}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" "$MIRROR"
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*
tar -C "$root" -c . | docker import \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  - "$TAG"
echo "built $TAG"
