// Validates rendered Kubernetes objects (a JSON array on stdin) against the
// OpenAPI schemas of Kubernetes 1.27.1 (npm kubernetes-models 5.1.0) and the
// Prometheus Operator CRDs (@kubernetes-models/prometheus-operator 6.0.0).
// Exit 1 naming the first invalid object; a deliberately broken copy of the
// first Deployment must fail validation (so the check can fail at all).
//   node tests/deploy/validate_k8s.mjs < objects.json
import { readFileSync } from "node:fs";

const modulePath = (apiVersion) => {
  if (apiVersion === "monitoring.coreos.com/v1") {
    return "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";
  }
  return "kubernetes-models/" + apiVersion;  // "v1", "apps/v1", "networking.k8s.io/v1", ...
};
const model = async (obj) => {
  const mod = await import(modulePath(obj.apiVersion));  // ESM-only packages
  const Kind = mod[obj.kind];
  if (!Kind) throw new Error(`no schema for ${obj.apiVersion} ${obj.kind}`);
  return new Kind(obj);
};

const objects = JSON.parse(readFileSync(0, "utf8"));
let n = 0;
for (const obj of objects) {
  const name = `${obj.apiVersion} ${obj.kind}/${obj.metadata?.name}`;
  try {
    (await model(obj)).validate();
  } catch (e) {
    console.error(`INVALID ${name}: ${e.message}`);
    process.exit(1);
  }
  n++;
}
const deployment = objects.find((o) => o.kind === "Deployment");
const broken = structuredClone(deployment);
broken.spec.replicas = "two";
broken.spec.template.spec.containers[0].ports = [{ containerPort: "http" }];
let rejected = false;
try {
  (await model(broken)).validate();
} catch {
  rejected = true;
}
if (!rejected) {
  console.error("a Deployment with replicas: \"two\" validated: the validator checks nothing");
  process.exit(1);
}
console.log(`${n} objects valid (Kubernetes 1.27.1 schemas, Prometheus Operator CRDs)`);
