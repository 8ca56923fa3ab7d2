#!/usr/bin/env node
// Validates a kustomize directory of Kubernetes manifests (deploy/k8s/) offline.
//
//   node tests/deploy/validate-k8s.js [--help-dir HELPDIR] DIR...
//
// Several DIRs are checked in one run (one TypeScript compilation for all): each gets either
// "valid: DIR ..." or "INVALID DIR: ..." lines. Exit status 1 when any DIR has a problem.
// HELPDIR holds PROGRAM.help, the `--helpfull` output of kvserver, kvcoord and kvcli: then every
// flag a container or probe command passes to one of them must be a flag it has (without
// HELPDIR, or without a program's file, that check is left out and the run says so).
//
// 1. kustomization.yaml lists existing files, and every manifest in DIR is listed.
// 2. Every YAML document parses (duplicate keys are errors).
// 3. Schema: each object is checked against the Kubernetes API schema of its apiVersion/kind,
//    as bundled by the npm package kubernetes-models (JSON schemas from the Kubernetes OpenAPI
//    spec, compiled with ajv): types, required fields, enums, formats.
// 4. Unknown fields: the API schemas allow extra properties, so a misspelt or misplaced field
//    would pass step 3. Each object is therefore also type-checked as a TypeScript object
//    literal against kubernetes-models' interface for its kind (excess-property checks reject
//    every field the API does not define, at any depth).
// 5. rdkv's own rules: selectors match, the headless service governs the StatefulSet, the
//    cluster map in the ConfigMap is valid and names one server per replica at its stable DNS
//    name, the pod asks for an RDMA device and IPC_LOCK, has probes, and mounts its volumes
//    where the kvserver flags point. The kvcoord Deployment: at least 2 replicas, its own
//    labels (no kvserver selector picks its pods, nor its selector the kvservers), etcd from a
//    ConfigMap in the manifests, the kvservers' Secret, probes on /metrics, a
//    PodDisruptionBudget. Both workloads: the flags they pass exist (HELPDIR), every
//    FLAGS_<name> variable is listed in --tryfromenv (gflags ignores the others), secrets only
//    as files from the optional Secret rdkv-auth (no secret flag, variable or secretKeyRef), a
//    container port named metrics that --metrics_port serves on a non-loopback --metrics_host,
//    with prometheus.io annotations.
"use strict";
const fs = require("fs");
const os = require("os");
const path = require("path");
const { execFileSync } = require("child_process");
const YAML = require("yaml");

const argv = process.argv.slice(2);
let helpDir = null;
if (argv[0] === "--help-dir") {
  helpDir = argv[1];
  argv.splice(0, 2);
}
const dirs = argv;
if (dirs.length === 0 || (helpDir !== null && !helpDir)) {
  console.error("usage: validate-k8s.js [--help-dir HELPDIR] DIR...");
  process.exit(2);
}
// The flags of each program, from HELPDIR/PROGRAM.help: kvserver and kvcoord list theirs in
// gflags' format ("    -name (..."), kvcli as "  --name=TYPE" or "  --name". gflags' own flags
// are accepted by rdkv's programs without being listed.
const builtinFlags = ["flagfile", "fromenv", "tryfromenv", "undefok", "version"];
const programFlags = {};
for (const prog of ["kvserver", "kvcoord", "kvcli"]) {
  const f = helpDir && path.join(helpDir, `${prog}.help`);
  if (!f || !fs.existsSync(f)) continue;
  const names = [...fs.readFileSync(f, "utf8").matchAll(/^\s+(?:-([A-Za-z0-9_]+) \(|--([A-Za-z0-9_]+)(?:=\S*)?$)/gm)]
    .map((m) => m[1] || m[2]);
  if (names.length === 0) {
    console.error(`validate-k8s.js: ${f} lists no flags`);
    process.exit(2);
  }
  programFlags[prog] = new Set([...names, ...builtinFlags]);
}
const unchecked = ["kvserver", "kvcoord", "kvcli"].filter((p) => !programFlags[p]);
if (unchecked.length > 0) console.log(`note: flags of ${unchecked.join(", ")} not checked (no --help-dir file)`);
const models = path.join(__dirname, "node_modules", "kubernetes-models");
const tsSources = []; // {dir, file (generated .ts), lines}

function validateDir(dir, dirIndex) {
  const problems = [];
  const problem = (where, what) => problems.push(`${where}: ${what}`);

  // --- 1. kustomization ---------------------------------------------------------------------------
  const kustPath = path.join(dir, "kustomization.yaml");
  let kust = {};
  try {
    kust = YAML.parse(fs.readFileSync(kustPath, "utf8"), { uniqueKeys: true }) || {};
  } catch (e) {
    problem("kustomization.yaml", e.message);
  }
  const kustKeys = new Set(["apiVersion", "kind", "namespace", "resources", "images", "labels",
    "commonLabels", "commonAnnotations", "namePrefix", "nameSuffix", "patches", "replicas",
    "configMapGenerator", "secretGenerator", "generatorOptions", "components"]);
  for (const k of Object.keys(kust)) if (!kustKeys.has(k)) problem("kustomization.yaml", `unknown field '${k}'`);
  if (kust.apiVersion !== "kustomize.config.k8s.io/v1beta1") problem("kustomization.yaml", "apiVersion must be kustomize.config.k8s.io/v1beta1");
  if (kust.kind !== "Kustomization") problem("kustomization.yaml", "kind must be Kustomization");
  const resources = Array.isArray(kust.resources) ? kust.resources : [];
  if (resources.length === 0) problem("kustomization.yaml", "no resources");
  for (const r of resources) if (!fs.existsSync(path.join(dir, r))) problem("kustomization.yaml", `resource '${r}' does not exist`);
  for (const f of fs.readdirSync(dir)) {
    if (/\.ya?ml$/.test(f) && f !== "kustomization.yaml" && !resources.includes(f)) {
      problem("kustomization.yaml", `${f} is in the directory but not in resources`);
    }
  }
  const namespace = kust.namespace;

  // --- 2. parse -----------------------------------------------------------------------------------
  const objects = []; // {file, index, obj}
  for (const r of resources) {
    const file = path.join(dir, r);
    if (!fs.existsSync(file)) continue;
    const docs = YAML.parseAllDocuments(fs.readFileSync(file, "utf8"), { uniqueKeys: true });
    docs.forEach((doc, index) => {
      for (const e of doc.errors) problem(`${r}#${index}`, `YAML: ${e.message}`);
      for (const w of doc.warnings) problem(`${r}#${index}`, `YAML: ${w.message}`);
      const obj = doc.toJS();
      if (obj == null) return;
      objects.push({ file: r, index, obj });
    });
  }

  // --- 3. schema ----------------------------------------------------------------------------------
  const modulePath = (apiVersion, kind) => `kubernetes-models/${apiVersion}/${kind}`;
  for (const { file, index, obj } of objects) {
    const where = `${file}#${index} (${obj.kind || "?"} ${obj.metadata && obj.metadata.name})`;
    if (typeof obj.apiVersion !== "string" || typeof obj.kind !== "string") {
      problem(where, "apiVersion and kind are required");
      continue;
    }
    let Model;
    try {
      Model = require(modulePath(obj.apiVersion, obj.kind))[obj.kind];
    } catch (e) {
      problem(where, `unknown apiVersion/kind ${obj.apiVersion} ${obj.kind}`);
      continue;
    }
    try {
      new Model(obj).validate();
    } catch (e) {
      const details = (e.errors || []).map((x) => `${x.instancePath || "/"} ${x.message}`).join("; ");
      problem(where, `schema: ${details || e.message}`);
    }
  }

  // --- 4. unknown fields: collect a TypeScript file, compiled below for all dirs at once ------------
  {
    const lines = [];
    objects.forEach(({ file, index, obj }, i) => {
      if (typeof obj.apiVersion !== "string" || typeof obj.kind !== "string") return;
      const mod = path.join(models, obj.apiVersion, obj.kind);
      if (!fs.existsSync(mod + ".d.ts")) return; // reported in step 3
      const name = `${file.replace(/\W/g, "_")}_${index}_${obj.kind}`;
      lines.push(`import type { I${obj.kind} as T${i} } from ${JSON.stringify(mod)};`);
      lines.push(`export const ${name}: T${i} = ${JSON.stringify(obj, null, 2)};`);
    });
    tsSources.push({ dirIndex, file: `manifests_${dirIndex}.ts`, lines });
  }

  // --- 5. rdkv's rules ----------------------------------------------------------------------------
  const byKind = (kind) => objects.filter((o) => o.obj.kind === kind).map((o) => o.obj);
  const sts = byKind("StatefulSet");
  const svcs = byKind("Service");
  const cms = byKind("ConfigMap");
  const pdbs = byKind("PodDisruptionBudget");
  const matches = (selector, labels) => selector && Object.keys(selector).length > 0 &&
    Object.entries(selector).every(([k, v]) => labels && labels[k] === v);
  const deploys = byKind("Deployment");
  const rule = (ok, what) => { if (!ok) problem("rdkv", what); };

  // passedFlags(cmd, prog): the --flags that the command line cmd passes to
  // /usr/local/bin/<prog>, [{name, value}] (value undefined without "="); null when it does not
  // run prog. A value ends at whitespace or at the ")" closing a $(...).
  const passedFlags = (cmd, prog) => {
    const at = cmd.search(new RegExp(`/usr/local/bin/${prog}(?![\\w-])`));
    if (at < 0) return null;
    return [...cmd.slice(at).matchAll(/(?<![\w-])--([A-Za-z]\w*)(?:=([^\s)]*))?/g)]
      .map((m) => ({ name: m[1], value: m[2] }));
  };
  const secretFlags = ["auth_token", "admin_token"];
  const secretVars = ["RDKV_AUTH_TOKEN", "RDKV_ADMIN_TOKEN", "FLAGS_auth_token", "FLAGS_admin_token"];
  const loopback = /^["']?(127\.0\.0\.1|localhost|::1|\[::1\])["']?$/;

  // The rules both workloads follow: the StatefulSet's kvserver and the Deployment's kvcoord.
  // Returns what the workload-specific rules need, or null when there is no such container.
  function checkWorkload(w, containerName, prog) {
    const where = `${w.kind} ${w.metadata && w.metadata.name}`;
    const spec = w.spec || {};
    const tmpl = spec.template || {};
    const pod = tmpl.spec || {};
    const podLabels = (tmpl.metadata || {}).labels || {};
    const c = (pod.containers || []).find((x) => x.name === containerName);
    rule(!!c, `${where}: a container named ${containerName}`);
    if (!c) return null;
    const cmd = [...(c.command || []), ...(c.args || [])].join(" ");
    const flags = passedFlags(cmd, prog);
    rule(flags !== null, `${where}: the ${containerName} container runs /usr/local/bin/${prog}`);
    if (flags === null) return null;
    const known = programFlags[prog];
    const flag = (name) => flags.find((f) => f.name === name);

    // Flags, and the variables --tryfromenv reads.
    for (const f of flags) {
      if (known) rule(known.has(f.name), `${where}: ${prog} has no flag --${f.name}`);
      rule(!secretFlags.includes(f.name), `${where}: a secret on the command line (--${f.name}): pass --${f.name}_file`);
    }
    const tryList = flags.filter((f) => f.name === "tryfromenv" || f.name === "fromenv")
      .flatMap((f) => (f.value || "").split(",").filter(Boolean));
    if (known) {
      for (const n of tryList) rule(known.has(n), `${where}: --tryfromenv names ${n}, which ${prog} does not have`);
    }
    const vars = []; // {name, from, value}
    for (const e of c.env || []) {
      vars.push({ name: e.name, from: "env", value: e.value });
      const ref = (e.valueFrom || {}).secretKeyRef;
      rule(!ref, `${where}: ${e.name} is read from Secret ${ref && ref.name} into a variable: mount secrets as files`);
    }
    for (const ef of c.envFrom || []) {
      rule(!ef.secretRef, `${where}: envFrom Secret ${(ef.secretRef || {}).name}: mount secrets as files`);
      if (!ef.configMapRef) continue;
      const cm = cms.find((x) => x.metadata.name === ef.configMapRef.name);
      rule(!!cm || ef.configMapRef.optional === true, `${where}: envFrom ConfigMap ${ef.configMapRef.name} is in the manifests`);
      for (const [k, v] of Object.entries((cm && cm.data) || {})) {
        vars.push({ name: (ef.prefix || "") + k, from: `ConfigMap ${cm.metadata.name}`, value: v });
      }
    }
    for (const v of vars) {
      rule(!secretVars.includes(v.name), `${where}: a secret in the environment (${v.name}, ${v.from}): mount it as a file`);
      const m = /^FLAGS_(\w+)$/.exec(v.name);
      if (m) rule(tryList.includes(m[1]), `${where}: ${v.name} (${v.from}) is not in --tryfromenv: ${prog} would ignore it`);
    }

    // Secrets: files of the optional Secret rdkv-auth, mounted read-only.
    for (const name of ["auth_token_file", "admin_token_file"]) {
      const f = flag(name);
      rule(!!f, `${where}: --${name} is passed (when the Secret has it)`);
      if (!f) continue;
      const file = f.value || "";
      const m = (c.volumeMounts || []).find((x) => file.startsWith(`${x.mountPath.replace(/\/$/, "")}/`));
      const sec = m && ((pod.volumes || []).find((v) => v.name === m.name) || {}).secret;
      rule(!!sec && sec.secretName === "rdkv-auth" && sec.optional === true && m.readOnly === true,
        `${where}: --${name}=${file} is a file of the optional Secret rdkv-auth, mounted read-only`);
    }

    // Prometheus /metrics.
    const portDecl = (c.ports || []).find((p) => p.name === "metrics");
    rule(!!portDecl, `${where}: a container port named metrics`);
    const mport = flag("metrics_port");
    rule(!!mport && !!portDecl && Number(mport.value) === portDecl.containerPort,
      `${where}: --metrics_port is the container port named metrics`);
    const mhost = flag("metrics_host");
    rule(!!mhost && !loopback.test(mhost.value || ""),
      `${where}: --metrics_host is an address the kubelet and Prometheus reach (the default is 127.0.0.1)`);
    const ann = (tmpl.metadata || {}).annotations || {};
    rule(ann["prometheus.io/scrape"] === "true", `${where}: pod annotation prometheus.io/scrape: "true"`);
    rule(!!portDecl && ann["prometheus.io/port"] === String(portDecl.containerPort),
      `${where}: pod annotation prometheus.io/port is the metrics port`);
    rule(ann["prometheus.io/path"] === "/metrics", `${where}: pod annotation prometheus.io/path: /metrics`);

    // Probes that run kvcli pass it flags it has, and no secret.
    for (const pn of ["startupProbe", "readinessProbe", "livenessProbe"]) {
      const pc = ((c[pn] || {}).exec || {}).command;
      const pf = pc && passedFlags(pc.join(" "), "kvcli");
      for (const f of pf || []) {
        if (programFlags.kvcli) rule(programFlags.kvcli.has(f.name), `${where}: ${pn}: kvcli has no flag --${f.name}`);
        rule(!secretFlags.includes(f.name), `${where}: ${pn}: a secret on the command line (--${f.name})`);
      }
    }

    const sc = c.securityContext || {};
    rule(sc.allowPrivilegeEscalation === false, `${where}: securityContext allowPrivilegeEscalation: false`);
    rule(sc.readOnlyRootFilesystem === true, `${where}: securityContext readOnlyRootFilesystem: true`);
    rule(((sc.capabilities || {}).drop || []).includes("ALL"), `${where}: securityContext drops ALL capabilities`);
    return { where, spec, pod, podLabels, c, cmd, flags, flag, tryList, vars };
  }
  const rdmaAndIpcLock = (c, where) => {
    const res = c.resources || {};
    for (const kind of ["requests", "limits"]) {
      const v = (res[kind] || {})["rdma/rdma_shared_device_a"];
      rule(String(v) === "1", `${where}: resources.${kind} has rdma/rdma_shared_device_a: 1`);
    }
    const caps = ((c.securityContext || {}).capabilities || {}).add || [];
    rule(caps.includes("IPC_LOCK"), `${where}: securityContext adds capability IPC_LOCK`);
  };

  let kvserverPods = null;
  rule(sts.length === 1, "exactly one StatefulSet");
  if (sts.length === 1) {
    const s = sts[0];
    const spec = s.spec || {};
    const pod = (spec.template || {}).spec || {};
    const podLabels = ((spec.template || {}).metadata || {}).labels || {};
    const c = (pod.containers || []).find((x) => x.name === "kvserver") || {};
    const cmd = [...(c.command || []), ...(c.args || [])].join(" ");
    const replicas = spec.replicas;
    rule(Number.isInteger(replicas) && replicas >= 1, "StatefulSet replicas is a positive integer");
    rule(matches((spec.selector || {}).matchLabels, podLabels), "StatefulSet selector matches its pod labels");
    const svc = svcs.find((x) => x.metadata.name === spec.serviceName);
    rule(!!svc, `serviceName '${spec.serviceName}' names a Service`);
    if (svc) {
      rule(svc.spec.clusterIP === "None", "the governing Service is headless (clusterIP: None)");
      rule(matches(svc.spec.selector, podLabels), "the headless Service selects the kvserver pods");
    }
    kvserverPods = { labels: podLabels, selector: (spec.selector || {}).matchLabels };
    rule(pdbs.some((p) => matches((p.spec.selector || {}).matchLabels, podLabels)), "a PodDisruptionBudget selects the kvserver pods");
    rule(/kvserver/.test(cmd), "the kvserver container runs kvserver");
    rule(/--server_id="\$\{POD_NAME##\*-\}"/.test(cmd), "the server id is the pod ordinal (--server_id from POD_NAME)");
    const envNames = (c.env || []).map((e) => e.name);
    rule(envNames.includes("POD_NAME"), "POD_NAME comes from the downward API");
    rule(envNames.includes("RDMAV_HUGEPAGES_SAFE"), "RDMAV_HUGEPAGES_SAFE is set");
    const res = c.resources || {};
    for (const kind of ["requests", "limits"]) {
      const v = (res[kind] || {})["rdma/rdma_shared_device_a"];
      rule(String(v) === "1", `resources.${kind} has rdma/rdma_shared_device_a: 1`);
    }
    const caps = ((c.securityContext || {}).capabilities || {}).add || [];
    rule(caps.includes("IPC_LOCK"), "securityContext adds capability IPC_LOCK");
    const w = checkWorkload(s, "kvserver", "kvserver");
    if (w && (w.tryList.includes("etcd") || w.vars.some((v) => v.name === "FLAGS_etcd"))) {
      // etcd mode is switched on by FLAGS_etcd; kvserver refuses --cluster_map with --etcd.
      rule(/\$\(\[ -z "\$\{FLAGS_etcd:-\}" \] && echo --cluster_map=/.test(cmd),
        "with etcd in --tryfromenv, --cluster_map is passed only while FLAGS_etcd is empty (kvserver refuses both)");
    }
    rule(!!c.readinessProbe && !!c.livenessProbe, "readiness and liveness probes");
    const mounts = Object.fromEntries((c.volumeMounts || []).map((m) => [m.name, m.mountPath]));
    const claim = (spec.volumeClaimTemplates || []).find((v) => v.metadata.name === "data");
    rule(!!claim, "a volumeClaimTemplate named data");
    const dataDir = /--data_dir=([^\s)]+)/.exec(cmd);
    rule(dataDir && mounts.data === dataDir[1], "--data_dir is where the data volume is mounted");
    const mapFlag = /--cluster_map=([^\s)]+)/.exec(cmd);
    const mapVol = (pod.volumes || []).find((v) => v.configMap);
    rule(mapVol && mapFlag && path.dirname(mapFlag[1]) === mounts[mapVol.name], "--cluster_map is in the mounted ConfigMap");
    const port = ((c.ports || []).find((p) => p.name === "kv") || {}).containerPort;
    rule(/--port=(\d+)/.test(cmd) && Number(/--port=(\d+)/.exec(cmd)[1]) === port, "--port is the container port named kv");

    // The cluster map.
    const cm = mapVol && cms.find((x) => x.metadata.name === mapVol.configMap.name);
    rule(!!cm, "the cluster-map volume names a ConfigMap in the manifests");
    const key = mapFlag && path.basename(mapFlag[1]);
    if (cm && key) {
      let m = null;
      try {
        m = JSON.parse((cm.data || {})[key]);
      } catch (e) {
        problem("rdkv", `ConfigMap ${cm.metadata.name} key ${key}: not JSON: ${e.message}`);
      }
      if (m) {
        const known = new Set(["epoch", "shards", "servers", "owners"]);
        for (const k of Object.keys(m)) rule(known.has(k), `cluster map: unknown field '${k}'`);
        rule(Number.isInteger(m.epoch) && m.epoch > 0, "cluster map: epoch is a positive integer");
        rule(Number.isInteger(m.shards) && m.shards >= 1 && m.shards <= 4096, "cluster map: shards in 1..4096");
        const servers = Array.isArray(m.servers) ? m.servers : [];
        rule(servers.length === replicas, `cluster map: ${servers.length} servers for ${replicas} replicas`);
        servers.forEach((sv, i) => {
          const want = `${s.metadata.name}-${i}.${spec.serviceName}.${namespace}.svc.cluster.local:${port}`;
          rule(sv.id === i && sv.address === want, `cluster map: server ${i} is {"id": ${i}, "address": "${want}"} (got ${JSON.stringify(sv)})`);
        });
        if (m.owners !== undefined) {
          rule(Array.isArray(m.owners) && m.owners.length === m.shards, "cluster map: one owner per shard");
          const ids = new Set(servers.map((x) => x.id));
          rule((m.owners || []).every((o) => ids.has(o)), "cluster map: every owner is a server id");
        }
      }
    }
  }

  // The kvcoord Deployment.
  let kvcoordPods = null;
  rule(deploys.length === 1, "exactly one Deployment (kvcoord)");
  const k = deploys.length === 1 ? checkWorkload(deploys[0], "kvcoord", "kvcoord") : null;
  if (k) {
    const selector = (k.spec.selector || {}).matchLabels;
    kvcoordPods = { labels: k.podLabels, selector };
    rule(Number.isInteger(k.spec.replicas) && k.spec.replicas >= 2,
      `${k.where}: at least 2 replicas (one is elected; another stands by to take over)`);
    rule(matches(selector, k.podLabels), `${k.where}: its selector matches its pod labels`);
    if (kvserverPods) {
      rule(!matches(selector, kvserverPods.labels), `${k.where}: its selector does not pick the kvserver pods`);
      rule(!matches(kvserverPods.selector, k.podLabels), "the StatefulSet's selector does not pick the kvcoord pods");
    }
    for (const svc of svcs) rule(!matches(svc.spec.selector, k.podLabels), `Service ${svc.metadata.name} does not select the kvcoord pods`);
    const etcdVar = k.vars.find((v) => v.name === "FLAGS_etcd");
    rule(!!(k.flag("etcd") || (etcdVar && etcdVar.value)),
      `${k.where}: kvcoord gets its etcd endpoints (--etcd, or FLAGS_etcd with etcd in --tryfromenv)`);
    const tv = k.vars.find((v) => v.name === "FLAGS_transport");
    const transport = k.flag("transport") ? k.flag("transport").value : tv ? tv.value : "tcp";
    rule(transport === "tcp" || transport === "verbs", `${k.where}: transport is tcp or verbs (kvcoord has no auto), not ${transport}`);
    if (transport === "verbs") rdmaAndIpcLock(k.c, `${k.where} (verbs)`);
    const metricsPort = ((k.c.ports || []).find((p) => p.name === "metrics") || {}).containerPort;
    for (const pn of ["readinessProbe", "livenessProbe"]) {
      const h = (k.c[pn] || {}).httpGet;
      rule(!!h && h.path === "/metrics" && (h.port === "metrics" || (metricsPort && h.port === metricsPort)),
        `${k.where}: ${pn} is an HTTP GET of /metrics on the metrics port`);
    }
    rule(pdbs.some((p) => matches((p.spec.selector || {}).matchLabels, k.podLabels)), "a PodDisruptionBudget selects the kvcoord pods");
  }
  for (const p of pdbs) {
    const sel = (p.spec.selector || {}).matchLabels;
    const n = [kvserverPods, kvcoordPods].filter((w) => w && matches(sel, w.labels)).length;
    rule(n === 1, `PodDisruptionBudget ${p.metadata.name} selects the pods of one workload (kvserver or kvcoord)`);
  }

  return { objects, problems };
}

const results = dirs.map((d, i) => validateDir(d, i));

// --- 4, compiled: every excess property is a TypeScript error -----------------------------------
{
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "rdkv-k8s-"));
  for (const t of tsSources) fs.writeFileSync(path.join(tmp, t.file), t.lines.join("\n") + "\n");
  fs.writeFileSync(path.join(tmp, "tsconfig.json"), JSON.stringify({
    compilerOptions: { noEmit: true, strict: true, target: "es2020", module: "commonjs",
      moduleResolution: "node", types: [], pretty: false },
    files: tsSources.map((t) => t.file),
  }));
  const tsc = path.join(__dirname, "node_modules", "typescript", "bin", "tsc");
  let out = "";
  try {
    execFileSync(process.execPath, [tsc, "-p", path.join(tmp, "tsconfig.json")], { encoding: "utf8" });
  } catch (e) {
    out = `${e.stdout || ""}${e.stderr || ""}`.trim();
    if (!out) out = `tsc failed: ${e.message}`;
  }
  fs.rmSync(tmp, { recursive: true, force: true });
  for (const l of out.split("\n")) {
    if (!l.trim()) continue;
    const m = /manifests_(\d+)\.ts\((\d+),\d+\): error TS\d+: (.*)/.exec(l);
    if (!m) {
      for (const r of results) r.problems.push(`typescript: ${l.trim()}`);
      continue;
    }
    const t = tsSources.find((x) => x.dirIndex === Number(m[1]));
    const srcLines = t.lines.join("\n").split("\n");
    // Name the manifest: the nearest "export const <file>_<index>_<kind>" above the line.
    let owner = "?";
    for (let k = Number(m[2]) - 1; k >= 0; k--) {
      const d = /^export const (\w+):/.exec(srcLines[k]);
      if (d) { owner = d[1]; break; }
    }
    results[t.dirIndex].problems.push(`${owner}: unknown or mistyped field: ${m[3]}`);
  }
}

let failed = 0;
results.forEach(({ objects, problems }, i) => {
  if (problems.length > 0) {
    failed++;
    for (const p of [...new Set(problems)]) console.log(`INVALID ${dirs[i]}: ${p}`);
    console.log(`${problems.length} problem(s) in ${dirs[i]}`);
  } else {
    console.log(`valid: ${dirs[i]}: ${objects.length} objects (${objects.map((o) => o.obj.kind).join(", ")})`);
  }
});
process.exit(failed > 0 ? 1 : 0);
