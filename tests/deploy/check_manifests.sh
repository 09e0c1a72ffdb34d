#!/usr/bin/env bash
# Offline checks of deploy/ (label "deploy"): both kustomize overlays render
# with the objects deploy/README.md promises; the worker and router config
# files parse with the real binaries; the Prometheus rules pass promtool's
# checks and unit tests; the dashboards are what make_dashboards.py writes.
#   bash tests/deploy/check_manifests.sh SOURCE_DIR BIN_DIR
set -euo pipefail
src=$1; bin=$2
fail() { echo "FAIL: $*" >&2; exit 1; }
for tool in kubectl promtool; do
  command -v "$tool" >/dev/null || fail "$tool not found on PATH (CI machines have it)"
done
# Debian's python3 has python3-yaml (scripts/install-deps.sh).
py=/usr/bin/python3; [ -x "$py" ] || py=python3
"$py" -c "import yaml" || fail "python3-yaml missing (apt-get install python3-yaml)"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

for overlay in cpu gpu; do
  kubectl kustomize "$src/deploy/k8s/overlays/$overlay" > "$tmp/$overlay.yaml" \
    || fail "kubectl kustomize overlays/$overlay"
  "$py" - "$tmp/$overlay.yaml" "$overlay" <<'PY' || fail "overlays/$overlay content"
import json, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
overlay = sys.argv[2]
def objs(kind): return [d for d in docs if d["kind"] == kind]
names = lambda kind: sorted(d["metadata"]["name"] for d in objs(kind))
assert names("StatefulSet") == ["decode", "prefill-b0", "prefill-b1", "prefill-b2", "redis"], names("StatefulSet")
assert names("Deployment") == ["encoder", "router"], names("Deployment")
router = [d for d in objs("Deployment") if d["metadata"]["name"] == "router"][0]
assert router["spec"]["replicas"] >= 2
assert [h["spec"]["minReplicas"] for h in objs("HorizontalPodAutoscaler")] == [2]
assert len(objs("PodDisruptionBudget")) == 3 and len(objs("NetworkPolicy")) == 2
assert objs("PodMonitor"), "no PodMonitor"
assert all(d["metadata"].get("namespace") == "swaserve" for d in docs if d["kind"] != "Namespace")
headless = [s["metadata"]["name"] for s in objs("Service") if s["spec"].get("clusterIP") == "None"]
assert sorted(headless) == ["decode", "encoder", "prefill-b0", "prefill-b1", "prefill-b2"], headless
# The encoder (issue 23): probes, resources, its pod IP in Redis, drain within
# the grace period; its flags are written out for the binary check below.
enc = [d for d in objs("Deployment") if d["metadata"]["name"] == "encoder"][0]
ec = enc["spec"]["template"]["spec"]["containers"][0]
assert "readinessProbe" in ec and "livenessProbe" in ec and "limits" in ec["resources"]
assert "--advertise_host=$(POD_IP)" in ec["command"], ec["command"]
assert enc["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 20
assert enc["spec"]["template"]["metadata"]["labels"]["swaserve.io/metrics"] == "true"
open(sys.argv[1] + ".encoder-args", "w").write("\n".join(ec["command"][1:]) + "\n")
prefill_mib = {}
bounds = {"prefill-b0": ("0", "65536"), "prefill-b1": ("65536", "262144"), "prefill-b2": ("262144", "1048576")}
for s in objs("StatefulSet"):
    c = s["spec"]["template"]["spec"]["containers"][0]
    name = s["metadata"]["name"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert probe in c, (name, probe)
    assert "limits" in c["resources"] and "requests" in c["resources"], name
    if name == "redis":
        continue
    cmd = c["command"]
    # Workers advertise their pod IP, not 127.0.0.1.
    assert "--advertise_host=$(POD_IP)" in cmd, (name, cmd)
    env = {e["name"]: e.get("valueFrom", {}) for e in c["env"]}
    assert env["POD_IP"]["fieldRef"]["fieldPath"] == "status.podIP", name
    if name in bounds:
        lo, hi = bounds[name]
        assert f"--bucket_min_tokens={lo}" in cmd and f"--prefill.max_prompt_tokens={hi}" in cmd, cmd
        mib = [int(a.split("=", 1)[1]) for a in cmd if a.startswith("--kv.prefill_mib=")]
        assert len(mib) == 1, (name, cmd)
        assert not any(a.startswith("--kv.l2_ratio=") for a in cmd), (name, "checked at the default")
        prefill_mib[hi] = (mib[0], c["resources"]["limits"]["memory"])
    gpu = c["resources"]["limits"].get("nvidia.com/gpu")
    assert (gpu == "1") == (overlay == "gpu"), (name, gpu)
    assert s["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 20  # > --drain
# Only the router is reachable from outside the namespace.
pub = [p for p in objs("NetworkPolicy") if p["spec"]["podSelector"]]
assert [p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] for p in pub] == ["router"]
internal = [p for p in objs("NetworkPolicy") if not p["spec"]["podSelector"]][0]
for rule in internal["spec"]["ingress"]:
    for peer in rule["from"]:
        assert "podSelector" in peer or peer.get("namespaceSelector", {}).get("matchLabels"), peer
cms = {d["metadata"]["name"].rsplit("-", 1)[0]: d for d in objs("ConfigMap")}
assert set(cms) == {"swaserve-config", "swaserve-prometheus", "swaserve-dashboards"}, set(cms)
assert cms["swaserve-dashboards"]["metadata"]["labels"]["grafana_dashboard"] == "1"
open(sys.argv[1] + ".prefill-mib", "w").write(json.dumps(prefill_mib))
print(f"overlays/{overlay}: {len(docs)} objects OK")
PY
done

# overlays/cpu-shared-l3 (components/shared-l3): the cpu overlay plus a
# redis-l3 (allkeys-lru, apart from the registry's noeviction Redis) that
# every prefill worker uses as its L3, its flag last so that it wins.
kubectl kustomize "$src/deploy/k8s/overlays/cpu-shared-l3" > "$tmp/cpu-shared-l3.yaml" \
  || fail "kubectl kustomize overlays/cpu-shared-l3"
"$py" - "$tmp/cpu-shared-l3.yaml" "$tmp/cpu.yaml" <<'PY' || fail "overlays/cpu-shared-l3 content"
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
cpu = [d for d in yaml.safe_load_all(open(sys.argv[2])) if d]
key = lambda d: (d["kind"], d["metadata"]["name"])
added = sorted(set(map(key, docs)) - set(map(key, cpu)))
assert added == [("Service", "redis-l3"), ("StatefulSet", "redis-l3")], added
assert all(d["metadata"].get("namespace") == "swaserve" for d in docs if d["kind"] != "Namespace")
sts = {d["metadata"]["name"]: d for d in docs if d["kind"] == "StatefulSet"}
args = lambda n: sts[n]["spec"]["template"]["spec"]["containers"][0].get("args", [])
l3 = args("redis-l3")
assert l3[l3.index("--maxmemory-policy") + 1] == "allkeys-lru", l3
reg = args("redis")
assert reg[reg.index("--maxmemory-policy") + 1] == "noeviction", reg
for name in ("prefill-b0", "prefill-b1", "prefill-b2"):
    cmd = sts[name]["spec"]["template"]["spec"]["containers"][0]["command"]
    l3_flags = [a for a in cmd if a.startswith("--kv.l3=")]
    assert l3_flags[-1] == "--kv.l3=redis:redis-l3:6379", (name, l3_flags)
    # Write-through near the bound where a bucket lies above.
    near = [a for a in cmd if a.startswith("--kv.l3_write_through_near_bound=")]
    assert near == ([] if name == "prefill-b2" else ["--kv.l3_write_through_near_bound=0.75"]), (name, near)
svc = [d for d in docs if key(d) == ("Service", "redis-l3")][0]
assert svc["spec"]["selector"] == sts["redis-l3"]["spec"]["template"]["metadata"]["labels"]
print(f"overlays/cpu-shared-l3: {len(docs)} objects OK")
PY

# Every rendered object validates against the Kubernetes 1.27.1 OpenAPI
# schemas (npm kubernetes-models; package.json, installed by npm ci).
command -v node >/dev/null || fail "node not found on PATH (scripts/install-deps.sh installs it)"
[ -d "$src/node_modules/kubernetes-models" ] || fail "node_modules/kubernetes-models missing: run npm ci"
for overlay in cpu gpu cpu-shared-l3; do
  "$py" -c 'import json, sys, yaml; print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d]))' \
    "$tmp/$overlay.yaml" > "$tmp/$overlay.json"
  (cd "$src" && node tests/deploy/validate_k8s.mjs < "$tmp/$overlay.json") || fail "overlays/$overlay schema"
done

# The config files the pods mount parse (exit 2 = a bad key or type; the
# missing model then fails start-up with 1).
set +e
"$bin/swaserve-worker" --config="$src/deploy/k8s/base/worker.yaml" --model=/nonexistent \
  --role=prefill > "$tmp/w.log" 2>&1; rc=$?
set -e
[ "$rc" = 1 ] && grep -q "not a checkpoint directory" "$tmp/w.log" || { cat "$tmp/w.log"; fail "worker.yaml (rc $rc)"; }
set +e
"$bin/swaserve-router" --config="$src/deploy/k8s/base/router-config.yaml" --model=/nonexistent \
  > "$tmp/r.log" 2>&1; rc=$?
set -e
[ "$rc" = 1 ] && grep -q "tokenizer" "$tmp/r.log" || { cat "$tmp/r.log"; fail "router-config.yaml (rc $rc)"; }

# The encoder Deployment's flags parse (a missing model fails start-up with 1).
mapfile -t enc_args < "$tmp/cpu.yaml.encoder-args"
set +e
"$bin/swaserve-encoder" "${enc_args[@]}" --model=/nonexistent --redis= > "$tmp/e.log" 2>&1; rc=$?
set -e
[ "$rc" = 1 ] && grep -q "cannot read /nonexistent/config.json" "$tmp/e.log" \
  || { cat "$tmp/e.log"; fail "encoder.yaml flags (rc $rc)"; }

# Every KV pool holds one prompt at the top of what it serves
# (swaserve kv-plan, the same plan `swaserve up` uses): each prefill bucket's
# --kv.prefill_mib, and worker.yaml's decode_mib for the largest bucket.
"$bin/swaserve" kv-plan --model="$src/models/demo" --json > "$tmp/kv-plan.json" \
  || fail "swaserve kv-plan"
"$py" - "$tmp/kv-plan.json" "$tmp/cpu.yaml.prefill-mib" "$src/deploy/k8s/base/worker.yaml" <<'PY' \
  || fail "a KV pool is too small for its bucket, or a pod for its pool + L2 (swaserve kv-plan --model=models/demo)"
import json, sys, yaml
plan = json.load(open(sys.argv[1]))
given = {int(k): v for k, v in json.load(open(sys.argv[2])).items()}
def mib(q):  # a Kubernetes memory quantity in MiB
    for unit, f in (("Gi", 1024), ("Mi", 1)):
        if q.endswith(unit): return int(q[:-2]) * f
    raise ValueError(q)
for b in plan["prefill"]:
    pool, limit = given[b["max_tokens"]]
    assert pool >= b["mib"], (b, given)
    # The pod holds its pool and its L2 tier (the worker default ratio, as
    # kv-plan prints it) with 1 GiB to spare: else the kernel kills it once
    # the prefix cache has filled the L2.
    l2 = pool * b["l2_mib"] // b["mib"]
    assert mib(limit) >= pool + l2 + 1024, (b["max_tokens"], pool, l2, limit)
worker = yaml.safe_load(open(sys.argv[3]))
decode = worker["kv"]["decode_mib"]
assert decode >= plan["decode"]["mib"], (decode, plan["decode"])
print("KV pools hold their buckets, pods hold pool + L2:", given, "decode", decode, ">=",
      plan["decode"]["mib"])
PY

promtool check rules "$src/deploy/prometheus/rules/swaserve.rules.yml"
(cd "$src/deploy/prometheus/rules" && promtool test rules swaserve.rules.test.yml)

# The dashboards are the generator's output.
cp -r "$src/deploy/grafana" "$tmp/grafana"
"$py" "$tmp/grafana/make_dashboards.py" > /dev/null
diff -r "$src/deploy/grafana/dashboards" "$tmp/grafana/dashboards" \
  || fail "deploy/grafana/dashboards differ from make_dashboards.py's output (rerun it)"
echo "deploy checks passed"
