#!/usr/bin/env bash
# Set up a fresh Debian machine (as root) for imagebuild, then run a command:
#   scripts/host.sh imagebuild build recipes/...   # the main job
#   scripts/host.sh test [pytest args]             # the test suite
# Set-up is idempotent: Debian packages, the venv (.venv) and a running Docker engine.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the pipeline and its tests use: the engine and its CLI (BuildKit through Debian's
# docker.io client), mmdebstrap for bases, gpgv and Debian's keyring (a base is locked only from a
# signed InRelease; gpg signs the tests' own archives), and the real counterparts the tests talk to.
# (podman: a consumer of zstd layers, which Debian 12's Docker 20.10 cannot pull).
APT_PACKAGES=(docker.io mmdebstrap zstd python3 python3-venv ca-certificates git gpgv gpg debian-archive-keyring
              skopeo docker-registry apache2-utils openssl buildah umoci systemd-container
              xz-utils pigz oci-image-tool jq iproute2 podman
              qemu-user-static binfmt-support arch-test lxc
              containerd stargz-snapshotter)
# A lazy consumer of eStargz layers: stargz-snapshotter's daemon, which Debian does not ship, built from
# the Go library Debian does (tools/stargz-grpc; its packages are listed there).
mapfile -t STARGZ_BUILD < tools/stargz-grpc/APT_PACKAGES
APT_PACKAGES+=("${STARGZ_BUILD[@]}")

log() { printf '\033[1;36m[host]\033[0m %s\n' "$*" >&2; }

install_packages() {
  local missing=()
  for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    log "installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

make_venv() {
  if [ ! -x .venv/bin/imagebuild ] || [ pyproject.toml -nt .venv/.installed ]; then
    log "creating .venv and installing imagebuild with its test dependencies"
    [ -x .venv/bin/python ] || python3 -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e '.[test]'
    touch .venv/.installed
  fi
}

# arm64 images build and run here under emulation: the kernel's binfmt_misc runs arm64 binaries
# through qemu-user-static (its handler is registered with F, so it works inside containers too).
register_binfmt() {
  [ -e /proc/sys/fs/binfmt_misc/status ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || true
  if [ -e /proc/sys/fs/binfmt_misc/status ] && ! grep -qs '^enabled' /proc/sys/fs/binfmt_misc/qemu-aarch64; then
    update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
  fi
  arch-test arm64 >/dev/null 2>&1 || log "arm64 emulation is not available here (binfmt_misc): arm64 builds and tests will say so"
}

# LXC maps an unprivileged container's ids through newuidmap, which needs root's range in /etc/subuid
# and /etc/subgid: the one Proxmox gives root (u:0:100000:65536), added once (tests/lxc/test_lxc_start.py).
subid_ranges() {
  local file
  for file in /etc/subuid /etc/subgid; do
    grep -qsx 'root:100000:65536' "$file" || echo 'root:100000:65536' >> "$file"
  done
}

# tools/stargz-grpc built into the venv (tests/lazy_node.py and bench/lazy.py run it), again when main.go changed.
build_stargz() {
  local out=.venv/bin/stargz-grpc
  if [ ! -x "$out" ] || [ tools/stargz-grpc/main.go -nt "$out" ]; then
    log "building tools/stargz-grpc from Debian's Go packages"
    tools/stargz-grpc/build.sh "$out" >/dev/null
  fi
}

start_engine() {
  if /usr/bin/docker info >/dev/null 2>&1; then return; fi
  log "starting dockerd (log: /var/log/imagebuild-dockerd.log)"
  (setsid dockerd >/var/log/imagebuild-dockerd.log 2>&1 &)
  for _ in $(seq 1 60); do
    /usr/bin/docker info >/dev/null 2>&1 && return
    sleep 1
  done
  log "dockerd did not come up; its log:"; tail -n 30 /var/log/imagebuild-dockerd.log >&2; exit 3
}

install_packages
register_binfmt
subid_ranges
make_venv
build_stargz
start_engine
export IMAGEBUILD_DOCKER_CLI=/usr/bin/docker

case "${1:-}" in
  # With no arguments the whole suite runs, the slow flagship build included (CI runs exactly this).
  # With arguments the slow tier stays in unless they say -m themselves (pyproject's default drops it).
  test) shift
        marked=0; parallel=0
        for arg in "$@"; do
          [[ "$arg" == -m || "$arg" == -m* ]] && marked=1
          [[ "$arg" == -n || "$arg" == -n* || "$arg" == --numprocesses* || "$arg" == no:xdist ]] && parallel=1
        done
        ((marked)) || set -- -m "slow or not slow" "$@"
        # Two workers (pytest-xdist), each taking whole test files, so a module's fixtures (the flagship
        # image, a release's build) are made once. The suite waits on the engine, the network and the
        # disk as much as on the cores: two files at a time overlap those waits (docs/ci.md measures it).
        # IMAGEBUILD_TEST_WORKERS=N (0: one process), or -n / -p no:xdist in the arguments, sets it otherwise.
        # The files' order is tests/conftest.py's (longest first); xdist must not reorder them.
        ((parallel)) || set -- -n "${IMAGEBUILD_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"
        exec .venv/bin/python -m pytest "$@" ;;
  imagebuild) shift; exec .venv/bin/imagebuild "$@" ;;
  "") log "set up; run 'scripts/host.sh test' or 'scripts/host.sh imagebuild build RECIPE'" ;;
  *) exec "$@" ;;
esac
