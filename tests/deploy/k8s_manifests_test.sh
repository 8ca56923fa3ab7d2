#!/usr/bin/env bash
# Validates deploy/k8s/ against the Kubernetes API schemas, offline (tests/deploy/validate-k8s.js:
# schemas from the npm package kubernetes-models, unknown fields through TypeScript, rdkv's own
# rules for the kvserver StatefulSet and the kvcoord Deployment), and shows that the validator
# rejects broken copies.
#
#   tests/deploy/k8s_manifests_test.sh [BUILD_DIR]
#
# With BUILD_DIR (CTest passes it), the flags the manifests pass to kvserver, kvcoord and kvcli
# are checked against their --helpfull, and the kvcoord Deployment's command line (its
# environment and ConfigMap, the Secret's files present) is run with BUILD_DIR's kvcoord: it
# must start and serve /metrics where the probes and Prometheus look.
#
# Needs node and the packages of tests/deploy/package.json: `npm ci --prefix tests/deploy`
# (exits 77, SKIPPED, when they are missing).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ROOT=$DEPLOY_TEST_ROOT
HERE=$ROOT/tests/deploy
K8S=$ROOT/deploy/k8s
BUILD=${1:-}
[[ -z $BUILD ]] || BUILD=$(cd "$BUILD" && pwd)

command -v node >/dev/null || skip "node is not installed (Debian packages nodejs and npm)"
for m in kubernetes-models yaml typescript; do
  [[ -d $HERE/node_modules/$m ]] ||
    skip "npm package $m is not installed in tests/deploy/node_modules: run 'npm ci --prefix tests/deploy'"
done

WORK=$(mktemp -d /tmp/rdkv-k8s-test.XXXXXX)
coord_pid=""
cleanup() {
  [[ -n $coord_pid ]] && kill -KILL "$coord_pid" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# The programs' flags, for validate-k8s.js --help-dir.
HELP=$WORK/help
mkdir -p "$HELP"
have_help=0
if [[ -n $BUILD ]]; then
  have_help=1
  for p in server/kvserver coordinator/kvcoord tools/kvcli; do
    if [[ -x $BUILD/$p ]]; then
      "$BUILD/$p" --helpfull >"$HELP/${p#*/}.help" 2>&1 || true
    else
      bad "no ${p#*/} in $BUILD/${p%/*} (build it: the manifests' flags are checked against it)"
      have_help=0
    fi
  done
else
  echo "SKIPPED: the manifests' flags: no BUILD_DIR given (kvserver, kvcoord, kvcli --helpfull)"
fi

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
broken "kvcoord.yaml left out of kustomization.yaml" kustomization.yaml '/- kvcoord.yaml/d' \
  "kvcoord.yaml is in the directory but not in resources"
# The StatefulSet's etcd mode, /metrics, secrets.
broken "--cluster_map passed also in etcd mode" statefulset.yaml \
  's/\$(\[ -z "\${FLAGS_etcd:-}" \] \&\& echo \(--cluster_map=[^)]*\))/\1/' \
  "--cluster_map is passed only while FLAGS_etcd is empty"
broken "kvserver's /metrics on loopback" statefulset.yaml 's/--metrics_host="${POD_IP}"/--metrics_host=127.0.0.1/' \
  "StatefulSet rdkv: --metrics_host is an address the kubelet and Prometheus reach"
broken "kvserver pods without the scrape annotation" statefulset.yaml '/prometheus.io\/scrape:/d' \
  "StatefulSet rdkv: pod annotation prometheus.io/scrape"
broken "a kvserver secret in a variable" statefulset.yaml \
  '/^          env:$/a\            - name: RDKV_AUTH_TOKEN\n              valueFrom:\n                secretKeyRef:\n                  name: rdkv-auth\n                  key: token' \
  "StatefulSet rdkv: a secret in the environment (RDKV_AUTH_TOKEN, env)"
# The kvcoord Deployment.
broken "one kvcoord replica" kvcoord.yaml 's/^  replicas: 2$/  replicas: 1/' "at least 2 replicas"
broken "a kvcoord selector that misses its pods" kvcoord.yaml \
  '0,/^      app.kubernetes.io\/component: kvcoord/s//      app.kubernetes.io\/component: coordinator/' \
  "Deployment rdkv-kvcoord: its selector matches its pod labels"
broken "kvcoord pods labelled as kvservers" kvcoord.yaml \
  's/^        app.kubernetes.io\/component: kvcoord/        app.kubernetes.io\/component: kvserver/' \
  "the StatefulSet's selector does not pick the kvcoord pods"
broken "no PodDisruptionBudget for kvcoord" kvcoord.yaml '/^kind: PodDisruptionBudget/,$s/component: kvcoord/component: kvcord/' \
  "a PodDisruptionBudget selects the kvcoord pods"
broken "a FLAGS_ variable kvcoord would ignore" kvcoord.yaml 's/name: FLAGS_rereplicate/name: FLAGS_poll_ms/' \
  "FLAGS_poll_ms (env) is not in --tryfromenv: kvcoord would ignore it"
broken "a kvserver-only key in the shared etcd ConfigMap" configmap.yaml \
  's/^  FLAGS_cluster_name: rdkv$/  FLAGS_cluster_name: rdkv\n  FLAGS_etcd_lease_ttl_s: "5"/' \
  "FLAGS_etcd_lease_ttl_s (ConfigMap rdkv-etcd) is not in --tryfromenv: kvcoord would ignore it"
broken "no etcd for kvcoord" configmap.yaml 's/^  FLAGS_etcd: .*/  FLAGS_etcd: ""/' \
  "kvcoord gets its etcd endpoints"
broken "kvcoord on transport auto" kvcoord.yaml 's/value: verbs$/value: auto/' "transport is tcp or verbs"
broken "a secret on kvcoord's command line" kvcoord.yaml \
  's|echo --admin_token_file=/etc/rdkv-secrets/admin_token|echo --admin_token=$(cat /etc/rdkv-secrets/admin_token)|' \
  "Deployment rdkv-kvcoord: a secret on the command line (--admin_token)"
broken "kvcoord secrets from another Secret" kvcoord.yaml 's/secretName: rdkv-auth$/secretName: rdkv-coord-auth/' \
  "--admin_token_file=/etc/rdkv-secrets/admin_token is a file of the optional Secret rdkv-auth"
broken "kvcoord's /metrics on loopback" kvcoord.yaml 's/--metrics_host="${POD_IP}"/--metrics_host=127.0.0.1/' \
  "Deployment rdkv-kvcoord: --metrics_host is an address the kubelet and Prometheus reach"
broken "a kvcoord metrics port without its name" kvcoord.yaml 's/- name: metrics$/- name: prom/' \
  "Deployment rdkv-kvcoord: a container port named metrics"
broken "a scrape annotation on another port" kvcoord.yaml 's/prometheus.io\/port: "7410"/prometheus.io\/port: "7403"/' \
  "Deployment rdkv-kvcoord: pod annotation prometheus.io/port is the metrics port"
broken "a kvcoord probe on a path it does not serve" kvcoord.yaml \
  '0,/^              path: \/metrics$/s//              path: \/healthz/' \
  "Deployment rdkv-kvcoord: readinessProbe is an HTTP GET of /metrics on the metrics port"
# Flags the programs do not have (only with BUILD_DIR: checked against their --helpfull).
if ((have_help)); then
  broken "a kvcoord arg naming a flag kvcoord lacks" kvcoord.yaml 's/--name="${POD_NAME}"/--nme="${POD_NAME}"/' \
    "Deployment rdkv-kvcoord: kvcoord has no flag --nme"
  broken "a kvcoord --tryfromenv name kvcoord lacks" kvcoord.yaml 's/probe_ms,rereplicate/probe_msec,rereplicate/' \
    "Deployment rdkv-kvcoord: --tryfromenv names probe_msec, which kvcoord does not have"
  broken "a kvserver-only flag given to kvcoord" kvcoord.yaml 's/--metrics_port=7410/--metrics_port=7410 --etcd_lease_ttl_s=5/' \
    "Deployment rdkv-kvcoord: kvcoord has no flag --etcd_lease_ttl_s"
  broken "a kvserver arg naming a flag kvserver lacks" statefulset.yaml 's/--data_dir=\/var\/lib\/rdkv/--datadir=\/var\/lib\/rdkv/' \
    "StatefulSet rdkv: kvserver has no flag --datadir"
  broken "a probe passing kvcli a flag it lacks" statefulset.yaml 's/--connect_timeout_ms=5000/--connect_timeout=5000/' \
    "StatefulSet rdkv: livenessProbe: kvcli has no flag --connect_timeout"
fi

help_args=()
((have_help)) && help_args=(--help-dir "$HELP")
expect_rc 1 "validator run over deploy/k8s and ${#dirs[@]} broken copies (exit 1: some are invalid)" \
  node "$HERE/validate-k8s.js" "${help_args[@]}" "$K8S" "${dirs[@]}"
ALL=$OUT
OUT=$(grep -F -- "$K8S" <<<"$ALL" || true)
contains "deploy/k8s is valid (schema, unknown fields, rdkv rules)" "valid: $K8S: 8 objects"
((have_help)) && ! grep -q "^note: flags of" <<<"$ALL" && ok "  ... every flag checked against kvserver, kvcoord and kvcli --helpfull"
if grep -qF "INVALID $K8S:" <<<"$ALL"; then bad "deploy/k8s has problems:"; grep -F "INVALID $K8S:" <<<"$ALL" | sed 's/^/    | /'; fi
for i in "${!dirs[@]}"; do
  OUT=$(grep -F -- "INVALID ${dirs[i]}:" <<<"$ALL" || true)
  contains "rejects ${names[i]}" "${wants[i]}"
done

# --- the kvcoord Deployment's command line, run ------------------------------------------------
# Its sh -c line with the Deployment's environment (env values and the envFrom ConfigMap; the
# downward API's POD_NAME and POD_IP given here), the Secret's two files present, paths moved
# under $WORK and a free metrics port. etcd is not reached: kvcoord serves /metrics from the
# start and keeps trying etcd.
run_kvcoord() {
  local port sh_line
  port=$(free_base_port 1) || { echo "SKIPPED: running kvcoord: no free port"; return; }
  node - "$K8S" "$WORK/kvcoord" <<'EOF' || { bad "reading the kvcoord container's command and environment"; return; }
const fs = require("fs"), path = require("path");
const YAML = require(path.join(process.env.HERE, "node_modules", "yaml"));
const [dir, out] = process.argv.slice(2);
const objs = [];
for (const f of fs.readdirSync(dir).filter((f) => /\.yaml$/.test(f) && f !== "kustomization.yaml")) {
  for (const d of YAML.parseAllDocuments(fs.readFileSync(path.join(dir, f), "utf8"))) if (d.toJS()) objs.push(d.toJS());
}
const dep = objs.find((o) => o.kind === "Deployment");
const c = dep.spec.template.spec.containers.find((x) => x.name === "kvcoord");
const env = [];
for (const ef of c.envFrom || []) {
  const cm = objs.find((o) => o.kind === "ConfigMap" && o.metadata.name === ef.configMapRef.name);
  for (const [k, v] of Object.entries(cm.data)) env.push(`${ef.prefix || ""}${k}=${v}`);
}
for (const e of c.env || []) if (e.value !== undefined) env.push(`${e.name}=${e.value}`);
fs.writeFileSync(`${out}.env`, env.map((x) => x + "\0").join(""));
fs.writeFileSync(`${out}.cmd`, [...(c.command || []), ...(c.args || [])].map((x) => x + "\0").join(""));
fs.writeFileSync(`${out}.port`, String(c.ports.find((p) => p.name === "metrics").containerPort));
fs.writeFileSync(`${out}.path`, c.readinessProbe.httpGet.path);
EOF
  local envs=() cmd=() mport mpath
  mapfile -d '' envs <"$WORK/kvcoord.env"
  mapfile -d '' cmd <"$WORK/kvcoord.cmd"
  mport=$(cat "$WORK/kvcoord.port") mpath=$(cat "$WORK/kvcoord.path")
  check "kvcoord's command is /bin/sh -c LINE" test "${#cmd[@]}" = 3 -a "${cmd[0]}" = /bin/sh -a "${cmd[1]}" = -c
  sh_line=${cmd[2]}
  sh_line=${sh_line//\/usr\/local\/bin\/kvcoord/$BUILD/coordinator/kvcoord}
  sh_line=${sh_line//\/etc\/rdkv-secrets/$WORK/secrets}
  sh_line=${sh_line//\/etc\/rdkv-etcd-tls/$WORK/etcd-tls}
  sh_line=${sh_line//--metrics_port=$mport/--metrics_port=$port}
  mkdir -p "$WORK/secrets"
  (umask 077 && printf 'data-secret' >"$WORK/secrets/token" && printf 'admin-secret' >"$WORK/secrets/admin_token")
  env -i PATH="$PATH" "${envs[@]}" POD_NAME=rdkv-kvcoord-test POD_IP=127.0.0.1 /bin/sh -c "$sh_line" \
    >"$WORK/kvcoord.log" 2>&1 &
  coord_pid=$!
  local served=0
  for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$port$mpath" >"$WORK/metrics.txt" 2>/dev/null && { served=1; break; }
    kill -0 "$coord_pid" 2>/dev/null || break
    sleep 0.1
  done
  if ((served)); then
    ok "kvcoord started from the Deployment's command line serves $mpath on its metrics port"
  else
    bad "kvcoord from the Deployment's command line does not serve $mpath; its log:"
    sed 's/^/    | /' "$WORK/kvcoord.log"
    kill -KILL "$coord_pid" 2>/dev/null || true
    wait "$coord_pid" 2>/dev/null || true
    coord_pid=""
    return
  fi
  check "  ... rdkv_coordinator_is_leader 0 (no etcd here: standing for election)" \
    grep -q '^rdkv_coordinator_is_leader 0' "$WORK/metrics.txt"
  local argv
  argv=$(tr '\0' ' ' 2>/dev/null <"/proc/$coord_pid/cmdline" || true)
  check "  ... with the Secret's files as --auth_token_file and --admin_token_file" \
    bash -c '[[ $1 == *"--auth_token_file=$2/token "* && $1 == *"--admin_token_file=$2/admin_token "* ]]' _ "$argv" "$WORK/secrets"
  check "  ... and no etcd certificate flags without the rdkv-etcd-tls Secret" bash -c '[[ $1 != *--etcd_ca* ]]' _ "$argv"
  check "  ... named after its pod (--name)" grep -q "coordinator rdkv-kvcoord-test: standing for election" "$WORK/kvcoord.log"
  kill -TERM "$coord_pid" 2>/dev/null || true
  local rc=0
  wait "$coord_pid" || rc=$?
  coord_pid=""
  check "  ... and exits 0 on SIGTERM (the pod's stop)" test "$rc" = 0
}
if [[ -n $BUILD && -x $BUILD/coordinator/kvcoord ]] && command -v curl >/dev/null; then
  HERE=$HERE run_kvcoord
else
  echo "SKIPPED: running the kvcoord Deployment's command line: needs BUILD_DIR with kvcoord, and curl"
fi

# kustomize itself, where a kubectl is installed (not a Debian package; optional).
if command -v kubectl >/dev/null && kubectl kustomize --help >/dev/null 2>&1; then
  expect_rc 0 "kubectl kustomize builds deploy/k8s" kubectl kustomize "$K8S"
  check "  ... every object lands in namespace rdkv" \
    bash -c '[[ $(grep -c "^  namespace: rdkv$" <<<"$1") -ge 4 ]]' _ "$OUT"
else
  echo "SKIPPED: kubectl kustomize: no kubectl on this machine (optional)"
fi

finish
