# Shared by the container tests, container_podman.sh and slurm_container.sh (sourced, not
# run): Podman from Debian (runc) with a containers.conf and a storage of the test's own, and
# an image built from files of this machine: `podman import` of a root filesystem of Debian's
# merged-/usr links, root's passwd and group, the dynamic linker's cache and the alternatives
# its libraries go through (libblas.so.3), and a marker file, /etc/gpurun-test-image, that
# only the image has. /usr comes in read-only through --container-mounts (CONTAINER_ARGS),
# Debian's python3 and torch with it. The machine's adjustments, in the containers.conf:
# runc (crun refuses a hybrid cgroup layout), ulimits within the hard limits, cgroupfs, a
# file events log.
# shellcheck shell=bash
# The variables set here are read by the scripts that source this file.
# shellcheck disable=SC2034

# container_setup DIR: checks for podman, runc and root (skips without), writes the
# configuration into DIR, exports CONTAINERS_CONF and CONTAINERS_STORAGE_CONF, imports the
# image localhost/gpurun-test:1 and sets CONTAINER_ARGS. Registers container_clean to run
# at exit through the caller's exit hook (the caller calls it).
container_setup() {
    local dir=$1 fs t0
    command -v podman >/dev/null || skip "no podman (scripts/deps.sh installs podman and runc)"
    command -v runc >/dev/null || skip "no runc (scripts/deps.sh installs it)"
    [ "$(id -u)" = 0 ] || skip "rootful podman: the test runs as root"
    export CONTAINERS_CONF=$dir/containers.conf CONTAINERS_STORAGE_CONF=$dir/storage.conf
    cat >"$CONTAINERS_CONF" <<'EOF'
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
    # vfs: a storage that works on any file system DIR is on (overlay on overlay does not);
    # the image is 400 KiB. The run root holds conmon's attach socket, whose path must fit a
    # socket address (108 bytes): past that every podman run waits 20 s for it. So it is
    # short, beside DIR rather than in it.
    CONTAINER_RUNROOT=$(mktemp -d /tmp/gpr.XXXXXX)
    cat >"$CONTAINERS_STORAGE_CONF" <<EOF
[storage]
driver = "vfs"
graphroot = "$dir/storage"
runroot = "$CONTAINER_RUNROOT"
EOF
    fs=$dir/rootfs
    mkdir -p "$fs"/{etc,tmp,proc,sys,dev,usr,root,run,var/tmp}
    for d in bin lib lib64 sbin; do ln -s "usr/$d" "$fs/$d"; done
    printf 'root:x:0:0:root:/root:/bin/sh\n' >"$fs/etc/passwd"
    printf 'root:x:0:\n' >"$fs/etc/group"
    echo "gpurun test image" >"$fs/etc/gpurun-test-image"
    cp -a /etc/alternatives /etc/ld.so.cache /etc/ld.so.conf /etc/ld.so.conf.d "$fs/etc/"
    tar -C "$fs" -cf "$dir/rootfs.tar" .
    t0=$(date +%s%N)
    podman import -q "$dir/rootfs.tar" localhost/gpurun-test:1 >"$dir/import.out" 2>&1 ||
        fail "podman import: $(cat "$dir/import.out")"
    echo "# image imported in $((($(date +%s%N) - t0) / 1000000)) ms"
    CONTAINER_ARGS=(--container-image localhost/gpurun-test:1 --container-mounts /usr:/usr:ro)
}

# container_clean: what the test's podman holds goes (containers, storage, run root).
container_clean() {
    podman rm --force --all >/dev/null 2>&1 || true
    podman system reset --force >/dev/null 2>&1 || true
    [ -z "${CONTAINER_RUNROOT:-}" ] || rm -rf "$CONTAINER_RUNROOT"
}
