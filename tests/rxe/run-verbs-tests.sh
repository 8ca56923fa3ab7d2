#!/usr/bin/env bash
# Host side of the verbs test run: boots the Soft-RoCE VM and runs tests/rxe/verbs-suite.sh in
# it against the binaries of BUILD_DIR (default build/ci). Fails loudly when the VM or rxe cannot
# be set up (vm.sh exits 125) and when any verbs test fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build/ci}
for bin in tests/conformance_test tests/verbs_smoke_test tests/verbs_write_refused_test tests/verbs_auth_test tests/sigstop_test \
           server/kvserver tools/kvcli coordinator/kvcoord tests/history/history_load tests/history/lincheck; do
  [[ -x $B/$bin ]] || { echo "run-verbs-tests: $B/$bin is missing: build first (tests/run-all.sh build)" >&2; exit 1; }
done
rc=0
tests/rxe/vm.sh --timeout "${RDKV_VM_TIMEOUT:-2400}" -- tests/rxe/verbs-suite.sh "$B" || rc=$?
if [[ $rc == 125 ]]; then
  echo "run-verbs-tests: FAILED: the Soft-RoCE VM could not be set up (see rdkv-vm messages above)" >&2
elif [[ $rc != 0 ]]; then
  echo "run-verbs-tests: FAILED: verbs tests failed in the VM (exit $rc)" >&2
else
  echo "run-verbs-tests: all verbs tests passed in the Soft-RoCE VM"
fi
exit "$rc"
