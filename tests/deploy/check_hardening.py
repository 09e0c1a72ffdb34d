#!/usr/bin/env python3
"""Security checks of a rendered overlay (kubectl kustomize output).

  python3 tests/deploy/check_hardening.py RENDERED.yaml [--lab]

Fails (exit 1, naming the object) when
  - a pod lacks its securityContext: runAsNonRoot with a non-zero user,
    seccomp RuntimeDefault, and in every container readOnlyRootFilesystem,
    allowPrivilegeEscalation false and all capabilities dropped;
  - a container writes where no volume is mounted (/tmp for the swaserve
    processes, /data for Redis, a file L3 directory);
  - an image is not pinned by digest (name@sha256:<64 hex>);
  - the router's liveness probe is its readiness probe (a router without
    workers would be restarted), or readiness is not /health;
  - the router's API keys are off (--lab: on) or not read from a Secret;
  - a process that connects to Redis has no password file from the Secret,
    or a Redis does not require it;
  - the network policies do not deny by default or let through other
    traffic than each role needs: a connectivity matrix is evaluated over
    the policies (NetworkPolicy semantics: a pod selected by any policy of a
    direction accepts only what some policy of that direction allows).
"""
import re
import sys

import yaml

NAMESPACE = "swaserve"
DIGEST = re.compile(r"^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$")
SECRET_DIR = "/var/run/secrets/swaserve"
REDIS_PASSWORD = SECRET_DIR + "/redis/password"

docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
lab = "--lab" in sys.argv[2:]
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
    return ok


def workloads():
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield d["metadata"]["name"], d["spec"]["template"]


def by(kind, name):
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found[0] if found else None


def config_map(prefix):
    return [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith(prefix)][0]


def mounts(pod, container):
    """mountPath -> volume source of `container`."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    return {m["mountPath"]: volumes.get(m["name"], {}) for m in container.get("volumeMounts", [])}


def mounted_from(pod, container, path, source):
    """Whether `path` lies in a volume of type `source` (secret, emptyDir, ...)
    or, for persistentVolumeClaim, a claim template."""
    for mount_path, volume in mounts(pod, container).items():
        if path == mount_path or path.startswith(mount_path.rstrip("/") + "/"):
            if source == "persistentVolumeClaim":
                return not volume  # a volumeClaimTemplate: no entry in volumes
            return source in volume
    return False


def secret_of(pod, container, path):
    for mount_path, volume in mounts(pod, container).items():
        if path == mount_path or path.startswith(mount_path.rstrip("/") + "/"):
            return volume.get("secret", {}).get("secretName")
    return None


# --- securityContext, writable volumes, digests ------------------------------
for name, pod in workloads():
    spec = pod["spec"]
    psc = spec.get("securityContext", {})
    check(spec.get("automountServiceAccountToken") is False,
          f"{name}: automountServiceAccountToken must be false (no pod talks to the API)")
    containers = spec.get("containers", []) + spec.get("initContainers", [])
    for c in containers:
        csc = c.get("securityContext", {})
        where = f"{name}/{c['name']}"
        non_root = csc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        user = csc.get("runAsUser", psc.get("runAsUser"))
        seccomp = csc.get("seccompProfile", psc.get("seccompProfile", {})).get("type")
        check(non_root is True and user not in (None, 0),
              f"{where}: runAsNonRoot with a non-zero runAsUser")
        check(seccomp == "RuntimeDefault", f"{where}: seccompProfile RuntimeDefault")
        check(csc.get("readOnlyRootFilesystem") is True, f"{where}: readOnlyRootFilesystem")
        check(csc.get("allowPrivilegeEscalation") is False, f"{where}: allowPrivilegeEscalation false")
        check("ALL" in csc.get("capabilities", {}).get("drop", []), f"{where}: capabilities drop ALL")
        check(not csc.get("capabilities", {}).get("add"), f"{where}: no capabilities added")
        check(not csc.get("privileged"), f"{where}: not privileged")
        check(bool(DIGEST.match(c["image"])), f"{where}: image {c['image']} not pinned by digest")
        cmd = " ".join(c.get("command", []) + c.get("args", []))
        if "redis-server" in cmd:
            check(mounted_from(pod, c, "/data", "emptyDir") and "--dir /data" in cmd,
                  f"{where}: Redis's working directory /data on an emptyDir")
        else:
            check(mounted_from(pod, c, "/tmp", "emptyDir"), f"{where}: /tmp on an emptyDir")
        for arg in c.get("command", []):
            if arg.startswith("--kv.l3=file:"):
                l3 = arg.split(":", 1)[1]
                check(mounted_from(pod, c, l3, "persistentVolumeClaim"),
                      f"{where}: the L3 directory {l3} on its volume")
    check(psc.get("fsGroup") not in (None, 0), f"{name}: fsGroup (volumes writable by the user)")

# --- the router: probes and API keys ------------------------------------------
router = by("Deployment", "router")
rpod = router["spec"]["template"]
rc = rpod["spec"]["containers"][0]
live, ready = rc["livenessProbe"], rc["readinessProbe"]
check(live != ready and live.get("httpGet", {}).get("path") != ready.get("httpGet", {}).get("path"),
      "router: liveness must not be readiness (/health is 503 without workers)")
check(live.get("httpGet", {}).get("path") == "/livez", "router: liveness on /livez")
check(ready.get("httpGet", {}).get("path") == "/health", "router: readiness on /health")
router_cfg = yaml.safe_load(config_map("swaserve-config")["data"]["router.yaml"])
overrides = [a.split("=", 1)[1] for a in rc["command"] if a.startswith("--api_keys=")]
api_keys = overrides[-1] if overrides else router_cfg.get("api_keys", "")
if lab:
    check(api_keys == "", "lab: the router must serve without API keys")
    check(secret_of(rpod, rc, SECRET_DIR + "/api-keys") is None, "lab: no API key Secret mounted")
else:
    check(bool(api_keys), "router: API keys off in a production overlay (api_keys empty)")
    check(secret_of(rpod, rc, api_keys) == "swaserve-api-keys",
          f"router: api_keys {api_keys!r} not read from the Secret swaserve-api-keys")

# --- Redis: every client sends the password, every Redis requires it ---------
worker_cfg = yaml.safe_load(config_map("swaserve-config")["data"]["worker.yaml"])
for name, pod in workloads():
    for c in pod["spec"]["containers"]:
        cmd = c.get("command", [])
        flags = dict(a[2:].split("=", 1) for a in cmd if a.startswith("--") and "=" in a)
        binary = cmd[0] if cmd else ""
        if binary == "swaserve-router":
            pw = flags.get("redis_password_file", router_cfg.get("redis_password_file"))
        elif binary in ("swaserve-prefill", "swaserve-decode", "swaserve-worker"):
            pw = flags.get("redis_password_file", worker_cfg.get("redis_password_file"))
            if flags.get("kv.l3", "").startswith("redis:"):
                l3pw = flags.get("kv.l3_redis_password_file")
                check(l3pw == REDIS_PASSWORD and secret_of(pod, c, l3pw) == "swaserve-redis",
                      f"{name}: a redis: L3 without the password from the Secret")
        elif binary == "swaserve-encoder":
            pw = flags.get("redis_password_file")
        elif "redis-server" in " ".join(cmd):
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            script = " ".join(cmd)
            check('requirepass $(cat "$REDIS_PASSWORD_FILE")' in script and script.rstrip().endswith("EOF")
                  and "- <<EOF" in script, f"{name}: redis-server must read requirepass on stdin")
            pw = env.get("REDIS_PASSWORD_FILE")
            probe = " ".join(c["readinessProbe"]["exec"]["command"])
            check("REDISCLI_AUTH" in probe, f"{name}: the readiness probe must authenticate")
        else:
            check(False, f"{name}: unknown process {cmd[:1]}")
            continue
        check(pw == REDIS_PASSWORD and secret_of(pod, c, pw) == "swaserve-redis",
              f"{name}: Redis password file {pw!r} not from the Secret swaserve-redis")

# --- network policies ----------------------------------------------------------
policies = [d for d in docs if d["kind"] == "NetworkPolicy"]


def matches(selector, labels):
    if selector is None:
        return False
    for k, v in selector.get("matchLabels", {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions", []):
        op, vals = e["operator"], e.get("values", [])
        if op == "In" and labels.get(e["key"]) not in vals:
            return False
        if op == "NotIn" and labels.get(e["key"]) in vals:
            return False
        if op == "Exists" and e["key"] not in labels:
            return False
        if op == "DoesNotExist" and e["key"] in labels:
            return False
    return True


def peer_matches(peer, ep):
    """ep: {"ns": namespace, "ns_labels": {...}, "labels": {...}} or {"ip": ...}."""
    if "ipBlock" in peer:
        return "ip" in ep and ep["ip"] == "public"  # only public addresses are modelled
    if "ip" in ep:
        return False
    if "namespaceSelector" in peer:
        if not matches(peer["namespaceSelector"], ep["ns_labels"]):
            return False
    elif ep["ns"] != NAMESPACE:
        return False
    return "podSelector" not in peer or matches(peer["podSelector"], ep["labels"])


def port_matches(rule, port):
    return not rule.get("ports") or any(p.get("port") == port for p in rule["ports"])


def allowed(direction, pod_labels, peer, port):
    """Whether `direction` ("Ingress"/"Egress") traffic of a swaserve pod with
    `pod_labels` with `peer` on `port` passes the policies."""
    selecting = [p for p in policies if direction in p["spec"].get("policyTypes", [])
                 and matches(p["spec"]["podSelector"], pod_labels)]
    if not selecting:
        return True
    key, peers = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    for p in selecting:
        for rule in p["spec"].get(key, []):
            if port_matches(rule, port) and (peers not in rule or any(peer_matches(x, peer) for x in rule[peers])):
                return True
    return False


def pod(app):
    return {"ns": NAMESPACE, "ns_labels": {"kubernetes.io/metadata.name": NAMESPACE},
            "labels": {"app.kubernetes.io/name": app}}


def talks(src, dst, port):
    """src -> dst:port passes src's egress and dst's ingress policies."""
    ours = lambda ep: ep.get("ns") == NAMESPACE  # policies apply in their namespace only
    out = not ours(src) or allowed("Egress", src["labels"], dst, port)
    inn = not ours(dst) or allowed("Ingress", dst["labels"], src, port)
    return out and inn


outside = {"ns": "default", "ns_labels": {"kubernetes.io/metadata.name": "default"}, "labels": {}}
monitoring = {"ns": "monitoring", "ns_labels": {"kubernetes.io/metadata.name": "monitoring"},
              "labels": {}}
dns = {"ns": "kube-system", "ns_labels": {"kubernetes.io/metadata.name": "kube-system"},
       "labels": {"k8s-app": "kube-dns"}}
internet = {"ip": "public"}
R, P, D, E, S = pod("router"), pod("prefill"), pod("decode"), pod("encoder"), pod("redis")
UCX = 43210  # any port: UCX over TCP picks its own

deny = [p for p in policies if p["spec"]["podSelector"] == {}
        and set(p["spec"].get("policyTypes", [])) == {"Ingress", "Egress"}
        and not p["spec"].get("ingress") and not p["spec"].get("egress")]
check(bool(deny), "no default-deny NetworkPolicy (podSelector {}, Ingress+Egress, no rules)")
for role in ("router", "prefill", "decode", "encoder", "redis"):
    own = [p for p in policies if p["spec"]["podSelector"] != {} and matches(p["spec"]["podSelector"], pod(role)["labels"])]
    check(bool(own), f"no NetworkPolicy of its own for {role}")

expect = [
    # (what, src, dst, port, allowed)
    ("clients -> router HTTP", outside, R, 8000, True),
    ("clients -> router gRPC", outside, R, 50051, True),
    ("clients -> prefill", outside, P, 7000, False),
    ("clients -> decode", outside, D, 7000, False),
    ("clients -> encoder", outside, E, 7100, False),
    ("clients -> redis", outside, S, 6379, False),
    ("router -> redis", R, S, 6379, True),
    ("router -> prefill gRPC", R, P, 7000, True),
    ("router -> decode gRPC", R, D, 7000, True),
    ("router -> encoder gRPC", R, E, 7100, True),
    ("router -> prefill UCX", R, P, UCX, False),
    ("router -> DNS", R, dns, 53, True),
    ("router -> public http(s) (media URLs)", R, internet, 443, True),
    ("prefill -> decode (KV over UCX)", P, D, UCX, True),
    ("decode -> prefill", D, P, UCX, True),
    ("prefill -> prefill", P, P, 7000, True),
    ("decode -> decode (stream migration)", D, D, 7000, True),
    ("prefill -> redis", P, S, 6379, True),
    ("decode -> redis", D, S, 6379, True),
    ("prefill -> encoder", P, E, 7100, True),
    ("prefill -> DNS", P, dns, 53, True),
    ("prefill -> internet", P, internet, 443, False),
    ("prefill -> router", P, R, 8000, False),  # workers never call a router
    ("encoder -> redis", E, S, 6379, True),
    ("encoder -> prefill", E, P, 7000, False),
    ("encoder -> internet", E, internet, 443, False),
    ("redis -> anything", S, R, 8000, False),
    ("redis -> internet", S, internet, 443, False),
    ("monitoring -> worker metrics", monitoring, P, 9400, True),
    ("monitoring -> decode metrics", monitoring, D, 9400, True),
    ("monitoring -> encoder metrics", monitoring, E, 9400, True),
    ("monitoring -> router /metrics", monitoring, R, 8000, True),
    ("monitoring -> worker gRPC", monitoring, P, 7000, False),
    ("monitoring -> redis", monitoring, S, 6379, False),
]
if by("StatefulSet", "redis-l3"):
    L = pod("redis-l3")
    expect += [("prefill -> redis-l3", P, L, 6379, True), ("router -> redis-l3", R, L, 6379, False),
               ("decode -> redis-l3", D, L, 6379, False), ("clients -> redis-l3", outside, L, 6379, False)]
for what, src, dst, port, want in expect:
    got = talks(src, dst, port)
    check(got == want, f"network policy: {what} (port {port}) is {'allowed' if got else 'denied'}, "
                       f"should be {'allowed' if want else 'denied'}")

if failures:
    for f in failures:
        print("FAIL:", f, file=sys.stderr)
    sys.exit(1)
print(f"{sys.argv[1]}: securityContext, digests, probes, auth, Redis password and "
      f"{len(expect)} network paths OK")
