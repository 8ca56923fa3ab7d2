#!/usr/bin/env bash
# Installs rdkv from a build tree into a temporary prefix, builds client/examples (a standalone
# CMake project: find_package(rdkv) + rdkv::client) against it, starts a kvserver and runs
# the example's `hello` against it.
#
#   example_test.sh BUILD_DIR SOURCE_DIR KVSERVER [CXX_COMPILER]
set -euo pipefail
build=$1 src=$2 kvserver=$3 cxx=${4:-c++}
work=$(mktemp -d "${TMPDIR:-/tmp}/rdkv-example.XXXXXX")
server_pid=""
cleanup() {
  if [[ -n $server_pid ]]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "example_test: FAILED: $*" >&2; exit 1; }

echo "== install $build -> $work/prefix"
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log"; fail "cmake --install"; }

# The installed public headers are exactly rdkv/admin.h, rdkv/client.h and rdkv/status.h,
# self-contained.
headers=$(cd "$work/prefix/include" && find . -type f | sort | tr '\n' ' ')
[[ $headers == "./rdkv/admin.h ./rdkv/client.h ./rdkv/status.h " ]] || fail "installed headers are: $headers"
# Every "..." include of an installed header must itself be installed (no internal headers).
while read -r inc; do
  [[ -f $work/prefix/include/$inc ]] || fail "an installed header includes \"$inc\", which is not installed"
done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$work/prefix/include/rdkv/"*.h)
cmakedir=$(dirname "$(find "$work/prefix" -path '*/cmake/rdkv/rdkvConfig.cmake' | head -n1)")
[[ -f $cmakedir/rdkvConfig.cmake ]] || fail "no rdkvConfig.cmake installed"

# One archive: rdkv::client with the internal libraries folded in, nothing else installed.
archives=$(cd "$work/prefix" && find . -name '*.a' -o -name '*.so*' | sort | tr '\n' ' ')
[[ $archives == "./lib/librdkv_client.a " || $archives == "./lib64/librdkv_client.a " ]] ||
  fail "installed libraries are: $archives (want only librdkv_client.a)"
# The export defines rdkv::client alone, and passes no build flags of rdkv's own (warnings,
# sanitizers) to applications.
targets=$(grep -ho 'add_library(rdkv::[A-Za-z_]*' "$cmakedir"/rdkvTargets*.cmake | sort -u | tr '\n' ' ')
[[ $targets == "add_library(rdkv::client " ]] || fail "exported targets are: $targets"
if grep -nE 'rdkv_build_flags|fsanitize|-Werror|-Wall' "$cmakedir"/rdkvTargets*.cmake; then
  fail "the exported targets carry rdkv's build flags (above)"
fi
# rdma-core is required by the package only when this build has the verbs transport.
if grep -q '^RDKV_WITH_VERBS:BOOL=OFF' "$build/CMakeCache.txt"; then
  if grep -nE 'IBVERBS|RDMACM|ibverbs|rdmacm' "$cmakedir"/rdkvTargets*.cmake; then
    fail "a tcp-only install names rdma-core (above)"
  fi
fi

echo "== configure + build client/examples against the installed package"
cmake -S "$src/client/examples" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; fail "configuring the example"; }
cmake --build "$work/build" >"$work/build.log" 2>&1 || { cat "$work/build.log"; fail "building the example"; }

echo "== start kvserver"
"$kvserver" --port=0 --port_file="$work/port" --transport=tcp --memory=32MiB --huge_pages=false \
  >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 200); do
  [[ -s $work/port ]] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log"; fail "kvserver exited"; }
  sleep 0.1
done
[[ -s $work/port ]] || { cat "$work/server.log"; fail "kvserver did not write its port"; }
port=$(cat "$work/port")

echo "== hello 127.0.0.1:$port tcp"
"$work/build/hello" "127.0.0.1:$port" tcp || fail "hello exited $?"
echo "example_test: passed"
