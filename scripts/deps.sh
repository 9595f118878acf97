#!/usr/bin/env bash
# Installs the Debian packages gpurun's build, tests and demo need; a no-op when all are present.
set -euo pipefail

pkgs=(
    build-essential pkg-config make
    libuv1-dev libjansson-dev libssl-dev libinih-dev
    libslurm-dev libmunge-dev libpmix-dev libopenmpi-dev openmpi-bin
    slurmctld slurmd slurm-client munge
    iproute2 util-linux procps psmisc elfutils gdb patchelf
    clang libclang-rt-14-dev clang-format shellcheck groff-base
    python3-torch libtorch-dev pybind11-dev python3-pip cmake prometheus
)

missing=()
for p in "${pkgs[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

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
