#!/usr/bin/env bash
# Offline checks of deploy/ (label "deploy"): the kustomize overlays render
# with the objects deploy/README.md promises and pass the security checks
# (check_hardening.py: securityContext, image digests, probes, API keys,
# Redis password, network policies); the worker and router config files
# parse with the real binaries; the manifests' Redis command and probe run
# with a real redis-server, and a router started with the manifests' config
# against it authenticates (a wrong password stops it), answers /livez while
# /health says no workers, and wants an API key; build-image.sh records a
# digest that every pod then uses; the Prometheus rules pass promtool's
# checks and unit tests; the dashboards are what make_dashboards.py writes.
#   bash tests/deploy/check_manifests.sh SOURCE_DIR BIN_DIR
set -euo pipefail
src=$1; bin=$2
fail() { echo "FAIL: $*" >&2; exit 1; }
for tool in kubectl promtool redis-server redis-cli; do
  command -v "$tool" >/dev/null || fail "$tool not found on PATH (CI machines have it)"
done
# Debian's python3 has python3-yaml (scripts/install-deps.sh).
py=/usr/bin/python3; [ -x "$py" ] || py=python3
"$py" -c "import yaml" || fail "python3-yaml missing (apt-get install python3-yaml)"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

for overlay in cpu gpu cpu-lab; do
  kubectl kustomize "$src/deploy/k8s/overlays/$overlay" > "$tmp/$overlay.yaml" \
    || fail "kubectl kustomize overlays/$overlay"
  lab=; [ "$overlay" = cpu-lab ] && lab=--lab
  "$py" "$src/tests/deploy/check_hardening.py" "$tmp/$overlay.yaml" $lab \
    || fail "overlays/$overlay security checks"
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
assert len(objs("PodDisruptionBudget")) == 3
assert names("NetworkPolicy") == ["allow-dns", "default-deny", "encoder", "redis", "router", "workers"], names("NetworkPolicy")
# The Secrets are the operator's (deploy/README.md), never shipped.
assert not objs("Secret"), [d["metadata"]["name"] for d in objs("Secret")]
assert objs("PodMonitor"), "no PodMonitor"
assert all(d["metadata"].get("namespace") == "swaserve" for d in docs if d["kind"] != "Namespace")
headless = [s["metadata"]["name"] for s in objs("Service") if s["spec"].get("clusterIP") == "None"]
assert sorted(headless) == ["decode", "encoder", "prefill-b0", "prefill-b1", "prefill-b2"], headless
# The encoder: probes, resources, its pod IP in Redis, drain within
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
assert added == [("NetworkPolicy", "prefill-to-redis-l3"), ("NetworkPolicy", "redis-l3"),
                 ("Service", "redis-l3"), ("StatefulSet", "redis-l3")], added
assert all(d["metadata"].get("namespace") == "swaserve" for d in docs if d["kind"] != "Namespace")
assert sorted(set(map(key, cpu)) - set(map(key, docs))) == [], "objects lost"
sts = {d["metadata"]["name"]: d for d in docs if d["kind"] == "StatefulSet"}
container = lambda n: sts[n]["spec"]["template"]["spec"]["containers"][0]
script = lambda n: " ".join(container(n)["command"])
assert "--maxmemory-policy allkeys-lru" in script("redis-l3"), script("redis-l3")
assert "--maxmemory-policy noeviction" in script("redis"), script("redis")
# The same pinned image as the registry's Redis (the component's replacement).
assert container("redis-l3")["image"] == container("redis")["image"], container("redis-l3")["image"]
for name in ("prefill-b0", "prefill-b1", "prefill-b2"):
    cmd = sts[name]["spec"]["template"]["spec"]["containers"][0]["command"]
    l3_flags = [a for a in cmd if a.startswith("--kv.l3=")]
    assert l3_flags[-1] == "--kv.l3=redis:redis-l3:6379", (name, l3_flags)
    assert "--kv.l3_redis_password_file=/var/run/secrets/swaserve/redis/password" in cmd, cmd
    # Write-through near the bound where a bucket lies above.
    near = [a for a in cmd if a.startswith("--kv.l3_write_through_near_bound=")]
    assert near == ([] if name == "prefill-b2" else ["--kv.l3_write_through_near_bound=0.75"]), (name, near)
svc = [d for d in docs if key(d) == ("Service", "redis-l3")][0]
assert svc["spec"]["selector"] == sts["redis-l3"]["spec"]["template"]["metadata"]["labels"]
print(f"overlays/cpu-shared-l3: {len(docs)} objects OK")
PY
"$py" "$src/tests/deploy/check_hardening.py" "$tmp/cpu-shared-l3.yaml" \
  || fail "overlays/cpu-shared-l3 security checks"

# build-image.sh --record pins every pod of the overlays to the digest it is
# given (a copy of deploy/; the base's images: entry, which the shared L3
# component copies, and the gpu overlay's own).
cp -r "$src/deploy" "$tmp/deploy"
cpu_digest=sha256:$(printf '%064d' 1 | tr 0 a); gpu_digest=sha256:$(printf '%064d' 2 | tr 0 b)
bash "$src/deploy/docker/build-image.sh" --record "$cpu_digest" "$tmp/deploy/k8s/base/kustomization.yaml" >/dev/null \
  && bash "$src/deploy/docker/build-image.sh" --record "$gpu_digest" \
       "$tmp/deploy/k8s/overlays/gpu/kustomization.yaml" >/dev/null || fail "build-image.sh --record"
bash "$src/deploy/docker/build-image.sh" --record sha256:123 "$tmp/deploy/k8s/base/kustomization.yaml" \
  >/dev/null 2>&1 && fail "build-image.sh --record took a malformed digest"
for overlay in cpu cpu-shared-l3 cpu-lab gpu; do
  want=$cpu_digest; [ "$overlay" = gpu ] && want=$gpu_digest
  images=$(kubectl kustomize "$tmp/deploy/k8s/overlays/$overlay" | sed -n 's/^ *image: //p' | sort -u)
  [ "$images" = "ghcr.io/swaserve/swaserve@$want" ] \
    || fail "overlays/$overlay after build-image.sh --record: images $images"
done

# Every rendered object validates against the Kubernetes 1.27.1 OpenAPI
# schemas (npm kubernetes-models; package.json, installed by npm ci).
command -v node >/dev/null || fail "node not found on PATH (scripts/install-deps.sh installs it)"
[ -d "$src/node_modules/kubernetes-models" ] || fail "node_modules/kubernetes-models missing: run npm ci"
for overlay in cpu gpu cpu-shared-l3 cpu-lab; do
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

# The manifests' Redis and router, run for real: the Redis StatefulSet's
# command and readiness probe (its port, /data and the Secret's directory
# moved under $tmp) with redis-server; the router's command with the
# ConfigMap's router.yaml (the same moves, the demo model) against it.
# The lab overlay's router serves without a key.
"$py" - "$tmp/cpu.yaml" "$tmp/cpu-lab.yaml" "$bin" "$src/models/demo" "$tmp/run" <<'PY' || fail "Redis and router as the manifests run them"
import json, os, signal, socket, subprocess, sys, time, urllib.request, urllib.error, yaml
rendered, lab_rendered, bindir, model, work = sys.argv[1:]
docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
lab_docs = [d for d in yaml.safe_load_all(open(lab_rendered)) if d]
obj = lambda kind, name, docs=docs: [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name][0]
os.makedirs(work + "/data"); os.makedirs(work + "/secrets/redis"); os.makedirs(work + "/secrets/api-keys")
secrets = "/var/run/secrets/swaserve"
password = os.urandom(24).hex()
open(work + "/secrets/redis/password", "w").write(password + "\n")  # as `echo` would write it
open(work + "/wrong-password", "w").write("not-" + password)
api_key = "sk-" + os.urandom(16).hex()
open(work + "/secrets/api-keys/team-a", "w").write(api_key)
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]; sock.close()

redis = obj("StatefulSet", "redis")["spec"]["template"]["spec"]["containers"][0]
move = lambda a: (a.replace("--port 6379", f"--port {port} --bind 127.0.0.1").replace("--dir /data", f"--dir {work}/data")
                  .replace("-p 6379", f"-p {port}"))
env = dict(os.environ, **{e["name"]: e["value"].replace(secrets, work + "/secrets") for e in redis["env"]})
procs = []
def start(cmd, **kw):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    procs.append(p)
    return p
def wait_for(cond, what, seconds=30):
    end = time.time() + seconds
    while time.time() < end:
        if cond(): return
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")
try:
    server = start([move(a) for a in redis["command"]], env=env)
    probe = [move(a) for a in redis["readinessProbe"]["exec"]["command"]]
    wait_for(lambda: subprocess.call(probe, env=env) == 0, "the Redis readiness probe")
    bad_env = dict(env, REDIS_PASSWORD_FILE=work + "/wrong-password")
    assert subprocess.call(probe, env=bad_env, stderr=subprocess.DEVNULL) != 0, "probe passed with a wrong password"
    anonymous = subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True).stdout
    assert "NOAUTH" in anonymous, anonymous
    ps = subprocess.run(["ps", "-o", "args=", "-p", str(server.pid)], capture_output=True, text=True).stdout
    assert password not in ps, "the password is on redis-server's command line"

    router = obj("Deployment", "router")["spec"]["template"]["spec"]["containers"][0]
    config_map = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("swaserve-config")][0]
    config = yaml.safe_load(config_map["data"]["router.yaml"])
    config.update(model=model, redis=f"127.0.0.1:{port}", listen="127.0.0.1:0",
                  http={"host": "127.0.0.1", "port": 0})
    for k in ("redis_password_file", "api_keys"):
        config[k] = config[k].replace(secrets, work + "/secrets")
    yaml.safe_dump(config, open(work + "/router.yaml", "w"))
    cmd = [bindir + "/" + router["command"][0]] + [
        a.replace("/etc/swaserve/router.yaml", work + "/router.yaml") for a in router["command"][1:]]
    # A wrong password stops the start, saying so.
    wrong = start(cmd + ["--redis_password_file=" + work + "/wrong-password"])
    out = wrong.communicate(timeout=60)[0]
    assert wrong.returncode == 1 and "AUTH refused" in out and password not in out, (wrong.returncode, out[-2000:])
    # The right one: it serves.
    def serve(cmd, ports):
        r = start(cmd + ["--port_file=" + ports])
        wait_for(lambda: os.path.exists(ports) or r.poll() is not None, "the router's port file", 60)
        assert r.poll() is None, r.communicate()[0][-2000:]
        return r, json.load(open(ports))["http_port"]
    r, http = serve(cmd, work + "/router-ports.json")
    def get(path, key=None):
        req = urllib.request.Request(f"http://127.0.0.1:{http}{path}")
        if key: req.add_header("Authorization", "Bearer " + key)
        try:
            return urllib.request.urlopen(req, timeout=10).status
        except urllib.error.HTTPError as e:
            return e.code
    live, ready = router["livenessProbe"]["httpGet"]["path"], router["readinessProbe"]["httpGet"]["path"]
    assert get(live) == 200, ("liveness", live, get(live))
    assert get(ready) == 503, ("readiness without workers", ready, get(ready))
    assert get("/v1/models") == 401, get("/v1/models")
    assert get("/v1/models", "sk-wrong") == 401
    assert get("/v1/models", api_key) == 200, get("/v1/models", api_key)
    r.send_signal(signal.SIGTERM)
    r.communicate(timeout=30)
    lab = obj("Deployment", "router", lab_docs)["spec"]["template"]["spec"]["containers"][0]
    lab_cmd = [bindir + "/" + lab["command"][0]] + [
        a.replace("/etc/swaserve/router.yaml", work + "/router.yaml") for a in lab["command"][1:]]
    r, http = serve(lab_cmd, work + "/lab-router-ports.json")
    assert get("/v1/models") == 200, ("lab router without a key", get("/v1/models"))
    r.send_signal(signal.SIGTERM)
    r.communicate(timeout=30)
    print(f"Redis with requirepass from the Secret file, probe authenticated; router: wrong password "
          f"refused at start, {live} 200 and {ready} 503 without workers, API key required (none in the lab)")
finally:
    for p in procs:
        if p.poll() is None:
            p.kill(); p.wait()
PY

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
