#!/usr/bin/env bash
# Installs the Debian packages gpurun's build, tests and demo need, and, where the CUDA toolkit
# has cuDNN, the headers of NVIDIA's cuDNN frontend; a no-op when all are present.
set -euo pipefail

# The cuDNN frontend (github.com/NVIDIA/cudnn-frontend, MIT): header-only C++ over cuDNN's
# graph API, what the CUDA backend's attention is built with (kernels/cuda/attention_cudnn.cpp).
# Debian has no package of it; its headers come from the PyPI wheel of this version, checked
# against this hash, and go to $CUDNN_FE_PREFIX/include as the project's own install does.
CUDNN_FE_VERSION=1.32.0
CUDNN_FE_WHEEL=nvidia_cudnn_frontend-$CUDNN_FE_VERSION-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
CUDNN_FE_SHA256=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0
CUDNN_FE_PREFIX=${CUDNN_FE_PREFIX:-/usr/local}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}

pkgs=(
    build-essential pkg-config make
    libuv1-dev libjansson-dev libssl-dev libinih-dev
    libslurm-dev libmunge-dev libpmix-dev libopenmpi-dev openmpi-bin
    slurmctld slurmd slurm-client munge
    iproute2 util-linux procps psmisc elfutils gdb patchelf podman runc
    clang libclang-rt-14-dev clang-format shellcheck groff-base
    python3-torch libtorch-dev pybind11-dev python3-pip python3-mpi4py cmake prometheus
)

missing=()
for p in "${pkgs[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done

# The frontend's headers, where cuDNN is there to use them and they are not yet installed.
cudnn_frontend() {
    local have tmp
    [ -e "$CUDA_HOME/include/cudnn.h" ] || return 0
    have=$(sed -n 's/^#define CUDNN_FRONTEND_\(MAJOR\|MINOR\|PATCH\)_VERSION \([0-9]*\).*/\2/p' \
        "$CUDNN_FE_PREFIX/include/cudnn_frontend_version.h" 2>/dev/null | paste -sd.) || have=
    [ "$have" = "$CUDNN_FE_VERSION" ] && return 0
    echo "deps.sh: installing the cuDNN frontend $CUDNN_FE_VERSION's headers in $CUDNN_FE_PREFIX/include"
    tmp=$(mktemp -d)
    /usr/bin/python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
        --platform manylinux_2_28_x86_64 -d "$tmp" "nvidia-cudnn-frontend==$CUDNN_FE_VERSION" ||
        { echo "deps.sh: cannot download nvidia-cudnn-frontend $CUDNN_FE_VERSION from PyPI" >&2; rm -rf "$tmp"; return 1; }
    echo "$CUDNN_FE_SHA256  $tmp/$CUDNN_FE_WHEEL" | sha256sum -c --quiet ||
        { echo "deps.sh: $CUDNN_FE_WHEEL does not match its pinned sha256" >&2; rm -rf "$tmp"; return 1; }
    /usr/bin/python3 -m zipfile -e "$tmp/$CUDNN_FE_WHEEL" "$tmp/x"
    $SUDO mkdir -p "$CUDNN_FE_PREFIX/include"
    $SUDO cp -r "$tmp/x/include/." "$CUDNN_FE_PREFIX/include/"
    $SUDO rm -f "$CUDNN_FE_PREFIX/include/cudnn_frontend/AGENTS.md"
    rm -rf "$tmp"
}

SUDO=
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null; then
    SUDO=sudo
fi
if [ ${#missing[@]} -eq 0 ]; then
    cudnn_frontend
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null; then
        SUDO=sudo
    else
        echo "deps.sh: missing packages (${missing[*]}) and not root: install them first" >&2
        exit 1
    fi
else
    SUDO=
fi
echo "deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# Debian's slurm/munge postinst scripts try to start services; there is no init here, so
# policy-rc.d keeps them from failing the install.
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
fi
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
cudnn_frontend
