#!/usr/bin/env bash
# Builds rdkv and runs every test: the one command README.md gives for "build and pass all tests".
#
#   tests/run-all.sh            all stages
#   tests/run-all.sh STAGE...   only these stages (deps build tsa test asan tsan fuzz vm)
#
# Stages:
#   deps   deploy/install-deps.sh (Debian packages; idempotent)
#   build  the `ci` preset: RelWithDebInfo, warnings as errors
#   tsa    the `tsa` preset: every translation unit of the tree (tests and benchmarks too)
#          compiled by clang with -Wthread-safety -Wthread-safety-beta -Werror, which checks
#          the locking annotations (GUARDED_BY, REQUIRES, ACQUIRED_BEFORE, ...) and clang's own
#          warnings; then tests/util/thread_safety_test.sh shows the check refuses code that
#          breaks them. The analysis is in clang's front end, so the units are compiled with
#          -fsyntax-only (tests/util/syntax_check.py): no code generation, no linking.
#   test   ctest on that build (unit, transport over tcp, end-to-end over tcp, tools)
#   asan   ASan+UBSan build, the same tests
#   tsan   ThreadSanitizer build, the concurrency tests
#   fuzz   libFuzzer targets (clang), each for RDKV_FUZZ_SECONDS (default 30)
#   vm     the verbs tests for real, inside a qemu VM with Soft-RoCE (tests/rxe/)
#
# Opt-outs (each prints SKIPPED and why): RDKV_SKIP_VM=1, RDKV_SKIP_SANITIZERS=1.
# RDKV_PRUNE_BUILDS=1 (the default under CI=true): a sanitizer or fuzz build tree is removed
# once its stage has passed, so the disk holds at most the ci and tsa trees and one other (CI machines
# have had little disk to spare). Each stage starts by printing the free disk.
# Exit status: 0 only when every stage that ran passed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
JOBS=${RDKV_JOBS:-$(nproc)}
PRUNE=${RDKV_PRUNE_BUILDS:-$([[ ${CI:-} == true ]] && echo 1 || echo 0)}
export CTEST_PARALLEL_LEVEL=${CTEST_PARALLEL_LEVEL:-2}

stages=("$@")
if ((${#stages[@]} == 0)); then stages=(deps build tsa test asan tsan fuzz vm); fi

declare -a summary=()
run_stage() {
  local name=$1
  shift
  local start=$SECONDS rc=0
  echo "=== rdkv: stage $name ($(df -h --output=avail . | tail -1 | tr -d ' ') free on $(df --output=target . | tail -1)) ==="
  # The stage runs in a subshell with errexit of its own, outside any `if` or `||`: there bash
  # ignores errexit inside functions, and a failed step (a build) would be hidden by the next
  # one (its tests) succeeding or failing for another reason.
  set +e
  (
    set -e
    "$@"
  )
  rc=$?
  set -e
  if ((rc == 0)); then
    summary+=("$name: passed in $((SECONDS - start)) s")
    prune_after "$name"
  else
    summary+=("$name: FAILED (exit $rc) after $((SECONDS - start)) s")
    printf '%s\n' "${summary[@]}"
    echo "=== rdkv: stage $name FAILED ==="
    exit 1
  fi
}

# The trees no later stage reads: asan, tsan and fuzz (vm runs build/ci's binaries).
prune_after() {
  [[ $PRUNE == 1 ]] || return 0
  case $1 in
    asan | tsan | fuzz)
      [[ -d build/$1 ]] || return 0
      echo "rdkv: removing build/$1 (RDKV_PRUNE_BUILDS=1): $(du -sh "build/$1" | cut -f1)"
      rm -rf "build/$1"
      ;;
  esac
}

stage_deps() { deploy/install-deps.sh; }
stage_build() {
  cmake --preset ci >/dev/null
  cmake --build --preset ci -j "$JOBS"
}
stage_tsa() {
  cmake --preset tsa >/dev/null
  python3 tests/util/syntax_check.py build/tsa "$JOBS"
  tests/util/thread_safety_test.sh clang++ "$ROOT"
}
# Labels excluded (`ctest --print-labels` lists them all; tests/CMakeLists.txt sets them):
#   verbs    needs a real RDMA device (sigstop_test, verbs_smoke_test, verbs_write_refused_test):
#            without one they only report SKIPPED; stage vm runs them for real in the VM.
#   deploy   (sanitizer stages) the deploy/ scripts, manifests and units: shell, YAML and
#            node, nothing instrumented that the ci stage does not already run.
#   install  (sanitizer stages) client_example_install builds an application against the
#            installed package, which carries no sanitizer flags (users' builds are not
#            instrumented), so it cannot link the instrumented archive.
stage_test() { ctest --preset ci --label-exclude verbs --timeout 600; }

sanitizer_build() {
  local preset=$1
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j "$JOBS"
}
stage_asan() {
  if [[ ${RDKV_SKIP_SANITIZERS:-0} == 1 ]]; then echo "SKIPPED: asan (RDKV_SKIP_SANITIZERS=1)"; return 0; fi
  sanitizer_build asan
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --preset asan --label-exclude "verbs|deploy|install" --timeout 900
}
stage_tsan() {
  if [[ ${RDKV_SKIP_SANITIZERS:-0} == 1 ]]; then echo "SKIPPED: tsan (RDKV_SKIP_SANITIZERS=1)"; return 0; fi
  sanitizer_build tsan
  # The torture test runs a smaller (still >= 200k GETs) load under TSan's 5-15x slowdown.
  RDKV_TORTURE_GETS=${RDKV_TSAN_TORTURE_GETS:-200000} \
    ctest --preset tsan --label-exclude "verbs|deploy|install" --timeout 900
}
stage_fuzz() {
  cmake --preset fuzz >/dev/null
  cmake --build --preset fuzz -j "$JOBS" --target rdkv_fuzzers
  tests/fuzz/run-fuzzers.sh build/fuzz "${RDKV_FUZZ_SECONDS:-30}"
}
stage_vm() {
  if [[ ${RDKV_SKIP_VM:-0} == 1 ]]; then
    echo "SKIPPED: Soft-RoCE VM stage (RDKV_SKIP_VM=1): the verbs tests did NOT run"
    return 0
  fi
  tests/rxe/run-verbs-tests.sh build/ci
}

for s in "${stages[@]}"; do
  case $s in
    deps | build | tsa | test | asan | tsan | fuzz | vm) run_stage "$s" "stage_$s" ;;
    *) echo "unknown stage '$s' (deps build tsa test asan tsan fuzz vm)" >&2; exit 2 ;;
  esac
done
echo "=== rdkv: summary ==="
printf '%s\n' "${summary[@]}"
echo "rdkv: all stages passed"
