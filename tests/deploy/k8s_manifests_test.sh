#!/usr/bin/env bash
# Validates deploy/k8s/ against the Kubernetes API schemas, offline (tests/deploy/validate-k8s.js:
# schemas from the npm package kubernetes-models, unknown fields through TypeScript, rdkv's own
# rules), and shows that the validator rejects broken copies.
#
#   tests/deploy/k8s_manifests_test.sh
#
# Needs node and the packages of tests/deploy/package.json: `npm ci --prefix tests/deploy`
# (exits 77, SKIPPED, when they are missing).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ROOT=$DEPLOY_TEST_ROOT
HERE=$ROOT/tests/deploy
K8S=$ROOT/deploy/k8s

command -v node >/dev/null || skip "node is not installed (Debian packages nodejs and npm)"
for m in kubernetes-models yaml typescript; do
  [[ -d $HERE/node_modules/$m ]] ||
    skip "npm package $m is not installed in tests/deploy/node_modules: run 'npm ci --prefix tests/deploy'"
done

WORK=$(mktemp -d /tmp/rdkv-k8s-test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# Broken copies, each with one mistake the validator must report. All are checked together with
# the real manifests in one validator run (one TypeScript compilation: it is the slow part).
names=() wants=() dirs=()
# broken NAME FILE SED-EXPRESSION EXPECTED-TEXT
broken() {
  local n=${#names[@]} d
  d=$WORK/broken-$n
  cp -r "$K8S" "$d"
  sed -i "$3" "$d/$2"
  if cmp -s "$K8S/$2" "$d/$2"; then bad "$1: the mutation '$3' changed nothing"; return; fi
  names+=("$1") wants+=("$4") dirs+=("$d")
}
broken "a misspelt field" statefulset.yaml 's/^  volumeClaimTemplates:/  volumeClaimTemplate:/' \
  "'\"volumeClaimTemplate\"' does not exist"
broken "a field in the wrong place" statefulset.yaml 's/^            periodSeconds: 5/            periodSecond: 5/' \
  "'\"periodSecond\"' does not exist"
broken "a wrong type" statefulset.yaml 's/^  replicas: 3/  replicas: "three"/' "/spec/replicas must be integer"
broken "a value outside an enum" statefulset.yaml 's/podManagementPolicy: Parallel/podManagementPolicy: Sometimes/' \
  "podManagementPolicy must be equal to one of the allowed values"
broken "a duplicate key" service.yaml 's/^  clusterIP: None/  clusterIP: None\n  clusterIP: 10.0.0.1/' \
  "Map keys must be unique"
broken "a missing IPC_LOCK" statefulset.yaml 's/add: \["IPC_LOCK"\]/add: []/' "adds capability IPC_LOCK"
broken "a missing RDMA device request" statefulset.yaml '0,/rdma\/rdma_shared_device_a: 1/{/rdma\/rdma_shared_device_a: 1/d}' \
  "resources.requests has rdma/rdma_shared_device_a: 1"
broken "replicas that disagree with the cluster map" statefulset.yaml 's/^  replicas: 3/  replicas: 4/' \
  "3 servers for 4 replicas"
broken "an invalid cluster map" configmap.yaml 's/"epoch": 1/"epoch": 0/' "epoch is a positive integer"
broken "a file left out of kustomization.yaml" kustomization.yaml '/- pdb.yaml/d' "pdb.yaml is in the directory but not in resources"

expect_rc 1 "validator run over deploy/k8s and ${#dirs[@]} broken copies (exit 1: some are invalid)" \
  node "$HERE/validate-k8s.js" "$K8S" "${dirs[@]}"
ALL=$OUT
OUT=$(grep -F -- "$K8S" <<<"$ALL" || true)
contains "deploy/k8s is valid (schema, unknown fields, rdkv rules)" "valid: $K8S: 5 objects"
if grep -qF "INVALID $K8S:" <<<"$ALL"; then bad "deploy/k8s has problems:"; grep -F "INVALID $K8S:" <<<"$ALL" | sed 's/^/    | /'; fi
for i in "${!dirs[@]}"; do
  OUT=$(grep -F -- "INVALID ${dirs[i]}:" <<<"$ALL" || true)
  contains "rejects ${names[i]}" "${wants[i]}"
done

# kustomize itself, where a kubectl is installed (not a Debian package; optional).
if command -v kubectl >/dev/null && kubectl kustomize --help >/dev/null 2>&1; then
  expect_rc 0 "kubectl kustomize builds deploy/k8s" kubectl kustomize "$K8S"
  check "  ... every object lands in namespace rdkv" \
    bash -c '[[ $(grep -c "^  namespace: rdkv$" <<<"$1") -ge 4 ]]' _ "$OUT"
else
  echo "SKIPPED: kubectl kustomize: no kubectl on this machine (optional)"
fi

finish
