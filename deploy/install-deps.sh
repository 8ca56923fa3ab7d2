#!/usr/bin/env bash
# Installs everything rdkv needs to build, test and benchmark, from Debian packages.
# Idempotent: packages already present are left alone; apt runs only when something is missing.
#   deploy/install-deps.sh            build + test dependencies (what README's commands need)
#   deploy/install-deps.sh --bench    also the peers kvbench compares against (redis, memcached)
set -euo pipefail

build_pkgs=(
  build-essential cmake ninja-build pkg-config git
  libibverbs-dev librdmacm-dev ibverbs-providers ibverbs-utils rdmacm-utils perftest
  librocksdb-dev libgflags-dev libgoogle-glog-dev libgtest-dev libgmock-dev
  libxxhash-dev nlohmann-json3-dev libreadline-dev prometheus-cpp-dev
  libcurl4-openssl-dev libssl-dev openssl etcd-server etcd-client
  clang libclang-rt-14-dev lld
  iproute2 procps psmisc python3 systemd
)
# The Soft-RoCE VM harness (tests/rxe/): qemu under TCG, a busybox initramfs, the Debian kernel.
vm_pkgs=(qemu-system-x86 busybox-static cpio kmod)
bench_pkgs=(redis-server memcached libhiredis-dev libmemcached-dev)

want=("${build_pkgs[@]}" "${vm_pkgs[@]}")
if [[ "${1:-}" == "--bench" ]]; then want+=("${bench_pkgs[@]}"); fi

missing=()
for p in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# Node.js runs the offline Kubernetes schema check (tests/deploy). Use the machine's own node/npm
# when present (a NodeSource node ships npm and conflicts with Debian's npm package).
if ! command -v node >/dev/null 2>&1; then want+=(nodejs); missing+=(nodejs); fi
if ! command -v npm >/dev/null 2>&1; then want+=(npm); missing+=(npm); fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#want[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The schema validator's npm packages, pinned by tests/deploy/package-lock.json.
here=$(cd "$(dirname "$0")/.." && pwd)
if [[ -f $here/tests/deploy/package-lock.json && ! -d $here/tests/deploy/node_modules/kubernetes-models ]]; then
  echo "install-deps: npm ci in tests/deploy"
  npm ci --prefix "$here/tests/deploy" --no-audit --no-fund --loglevel=error
fi
echo "install-deps: done"
