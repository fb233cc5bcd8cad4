#!/usr/bin/env bash
# Builds deploy/Dockerfile (or $DOCKERFILE) as TAG with whichever of docker, podman or buildah
# works here. When the official base image cannot be pulled (no registry reachable), a base is
# made locally (make_base.sh) and passed as the PYTHON_IMAGE build argument. When pip reaches
# package indexes through a TLS-intercepting proxy whose CA this host trusts (PIP_CERT or
# SSL_CERT_FILE), that CA goes in as the build secret `ca`: the build uses it, the image does
# not keep it. Usage: build.sh [TAG]
set -euo pipefail
tag=${1:-localhost/lmserve:cpu}
dockerfile=${DOCKERFILE:-deploy/Dockerfile}
official=${PYTHON_IMAGE:-python:3.11.14-slim-bookworm}
local_base=localhost/lmserve-base:bookworm
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.."

if docker info >/dev/null 2>&1; then
  tool=(docker build)
  pull=(docker pull)
  has=(docker image inspect)
elif command -v podman >/dev/null; then
  tool=(podman build --isolation chroot --layers)
  pull=(podman pull)
  has=(podman image exists)
elif command -v buildah >/dev/null; then
  tool=(buildah bud --isolation chroot --layers)
  pull=(buildah pull)
  has=(buildah inspect --type image)
else
  echo "build.sh: none of docker, podman, buildah is installed" >&2
  exit 2
fi

args=()
if ! timeout 120 "${pull[@]}" "$official" >/dev/null 2>&1; then
  if ! "${has[@]}" "$local_base" >/dev/null 2>&1; then
    echo "build.sh: cannot pull $official; making $local_base with debootstrap" >&2
    "$here/make_base.sh" "$local_base" >/dev/null
  fi
  args+=(--build-arg "PYTHON_IMAGE=$local_base")
fi
ca=${PIP_CERT:-${SSL_CERT_FILE:-}}
if [ -n "$ca" ] && [ -s "$ca" ]; then
  args+=(--secret "id=ca,src=$ca")
fi
"${tool[@]}" "${args[@]}" -f "$dockerfile" -t "$tag" .
