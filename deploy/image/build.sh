#!/usr/bin/env bash
# Builds deploy/Dockerfile (or $DOCKERFILE) as TAG with whichever of docker, podman or buildah
# works here. When the official base image cannot be pulled (no registry reachable), a base is
# made locally (make_base.sh) and passed as the PYTHON_IMAGE build argument. When pip reaches
# package indexes through a TLS-intercepting proxy whose CA this host trusts (PIP_CERT or
# SSL_CERT_FILE), that CA goes in as the build secret `ca`: the build uses it, the image does
# not keep it.
#
# --gpu builds deploy/Dockerfile.gpu (default tag localhost/lmserve:gpu) on nvidia/cuda
# ($CUDA_IMAGE); where that cannot be pulled, on a CUDA 12 + cuDNN 9 base made from the local
# Debian one with NVIDIA's PyPI wheels (Containerfile.cuda-base), passed as CUDA_IMAGE.
# Usage: build.sh [--gpu] [TAG]
set -euo pipefail
gpu=false
if [ "${1:-}" = --gpu ]; then
  gpu=true
  shift
fi
plain_base=localhost/lmserve-base:bookworm
if $gpu; then
  tag=${1:-localhost/lmserve:gpu}
  dockerfile=${DOCKERFILE:-deploy/Dockerfile.gpu}
  base_arg=CUDA_IMAGE
  official=${CUDA_IMAGE:-nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04}
  local_base=localhost/lmserve-cuda-base:bookworm
else
  tag=${1:-localhost/lmserve:cpu}
  dockerfile=${DOCKERFILE:-deploy/Dockerfile}
  base_arg=PYTHON_IMAGE
  official=${PYTHON_IMAGE:-python:3.11.14-slim-bookworm}
  local_base=$plain_base
fi
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

secret=()
ca=${PIP_CERT:-${SSL_CERT_FILE:-}}
if [ -n "$ca" ] && [ -s "$ca" ]; then
  secret+=(--secret "id=ca,src=$ca")
fi

args=()
if ! timeout 120 "${pull[@]}" "$official" >/dev/null 2>&1; then
  if ! "${has[@]}" "$local_base" >/dev/null 2>&1; then
    if ! "${has[@]}" "$plain_base" >/dev/null 2>&1; then
      echo "build.sh: cannot pull $official; making $plain_base with debootstrap" >&2
      "$here/make_base.sh" "$plain_base" >/dev/null
    fi
    if $gpu; then
      echo "build.sh: cannot pull $official; making $local_base from $plain_base" >&2
      empty=$(mktemp -d)
      trap 'rm -rf "$empty"' EXIT
      "${tool[@]}" "${secret[@]}" --build-arg "BASE=$plain_base" \
        -f "$here/Containerfile.cuda-base" -t "$local_base" "$empty"
    fi
  fi
  args+=(--build-arg "$base_arg=$local_base")
fi
"${tool[@]}" "${args[@]}" "${secret[@]}" -f "$dockerfile" -t "$tag" .
