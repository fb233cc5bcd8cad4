#!/usr/bin/env bash
# Makes the image base locally when the official one (python:3.11-slim-bookworm) cannot be pulled:
# Debian bookworm by debootstrap, with Python 3.11, venv, pip and the headers the build stage
# compiles against, imported as an image. Usage: make_base.sh [TAG]
set -euo pipefail
tag=${1:-localhost/lmserve-base:bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
root=$(mktemp -d /var/tmp/lmserve-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase \
  --include=python3,python3-venv,python3-pip,python3-dev,python-is-python3,ca-certificates \
  bookworm "$root" "$mirror" >&2
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
if command -v podman >/dev/null; then
  tar -C "$root" -c . | podman import - "$tag" >&2
else  # buildah alone: copy the tree into an empty container and commit it
  ctr=$(buildah from scratch)
  buildah copy "$ctr" "$root" / >&2
  buildah commit --rm "$ctr" "$tag" >&2
fi
echo "$tag"
