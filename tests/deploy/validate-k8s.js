#!/usr/bin/env node
// Validates a kustomize directory of Kubernetes manifests (deploy/k8s/) offline.
//
//   node tests/deploy/validate-k8s.js DIR...
//
// Several DIRs are checked in one run (one TypeScript compilation for all): each gets either
// "valid: DIR ..." or "INVALID DIR: ..." lines. Exit status 1 when any DIR has a problem.
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
//    where the kvserver flags point.
"use strict";
const fs = require("fs");
const os = require("os");
const path = require("path");
const { execFileSync } = require("child_process");
const YAML = require("yaml");

const dirs = process.argv.slice(2);
if (dirs.length === 0) {
  console.error("usage: validate-k8s.js DIR...");
  process.exit(2);
}
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
  const rule = (ok, what) => { if (!ok) problem("rdkv", what); };

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
    for (const p of pdbs) rule(matches((p.spec.selector || {}).matchLabels, podLabels), `PodDisruptionBudget ${p.metadata.name} selects the kvserver pods`);
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
    rule(!!c.readinessProbe && !!c.livenessProbe, "readiness and liveness probes");
    const mounts = Object.fromEntries((c.volumeMounts || []).map((m) => [m.name, m.mountPath]));
    const claim = (spec.volumeClaimTemplates || []).find((v) => v.metadata.name === "data");
    rule(!!claim, "a volumeClaimTemplate named data");
    const dataDir = /--data_dir=(\S+)/.exec(cmd);
    rule(dataDir && mounts.data === dataDir[1], "--data_dir is where the data volume is mounted");
    const mapFlag = /--cluster_map=(\S+)/.exec(cmd);
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
