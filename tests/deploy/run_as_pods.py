#!/usr/bin/env python3
"""Runs the cpu overlay's Redis, router, a prefill and a decode worker as their
pods would: each process with its manifest's command, environment, config
files (the ConfigMap), Secrets, user and group, no capabilities and
no_new_privs (setpriv), on a read-only root filesystem with writable storage
only where the manifest mounts a volume; then serves a completion through
the router with an API key from the Secret (none: 401), and every process
stops with status 0 on SIGTERM, having logged no permission error.

Run by readonly_pods_test.sh inside a mount namespace whose root is already
read-only, with a tmpfs on /tmp (the pods' emptyDir) and one on WORK (this
test's storage: the ConfigMap, the Secrets, the persistent and emptyDir
volumes other than /tmp). Everything runs on the host's network, so ports the
pods would each have to themselves are moved (flags appended, as an overlay
would); paths are moved into WORK the same way.

  python3 run_as_pods.py RENDERED.yaml BIN_DIR MODEL_DIR WORK
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import yaml

rendered, bindir, model, work = sys.argv[1:]
docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
SECRETS = "/var/run/secrets/swaserve"


def obj(kind, name):
    return [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name][0]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def fail(msg):
    raise SystemExit("FAIL: " + msg)


# The Secrets (as the kubelet writes them: root-owned, mode 0644) and the
# ConfigMap's files.
os.makedirs(f"{work}/secrets/redis")
os.makedirs(f"{work}/secrets/api-keys")
os.makedirs(f"{work}/etc")
password = os.urandom(24).hex()
api_key = "sk-" + os.urandom(16).hex()
open(f"{work}/secrets/redis/password", "w").write(password)
open(f"{work}/secrets/api-keys/team-a", "w").write(api_key)
redis_port = free_port()
config_map = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("swaserve-config")][0]
for name, text in config_map["data"].items():
    config = yaml.safe_load(text)
    config["model"] = model
    config["redis"] = f"127.0.0.1:{redis_port}"
    for k, v in list(config.items()):
        if isinstance(v, str) and v.startswith(SECRETS):
            config[k] = work + "/secrets" + v[len(SECRETS):]
    yaml.safe_dump(config, open(f"{work}/etc/{name}", "w"))


def move(arg):
    return (arg.replace("/etc/swaserve/", work + "/etc/").replace(SECRETS, work + "/secrets")
            .replace("/models/demo", model))


procs = {}


def start(name, port_overrides=(), extra_args=()):
    """Starts pod `name`'s container as its manifest says, on a read-only
    root, with its volumes' paths moved into WORK."""
    kind = "Deployment" if name == "router" else "StatefulSet"
    pod = obj(kind, name)["spec"]["template"]
    spec, c = pod["spec"], pod["spec"]["containers"][0]
    psc, csc = spec["securityContext"], c["securityContext"]
    # Writable volumes other than /tmp (the namespace's tmpfs): a directory
    # in WORK owned by the pod's user and fsGroup, as the kubelet prepares
    # them; the container's paths into them are moved there.
    moved = {}
    for m in c.get("volumeMounts", []):
        if m["mountPath"] in ("/tmp", "/etc/swaserve") or m["mountPath"].startswith(SECRETS):
            continue
        path = f"{work}/volumes/{name}{m['mountPath']}"
        os.makedirs(path, exist_ok=True)
        os.chown(path, psc["runAsUser"], psc["fsGroup"])
        os.chmod(path, 0o2775)
        moved[m["mountPath"]] = path

    def vol(arg):
        for mount_path, path in moved.items():
            arg = arg.replace(mount_path, path)
        return arg

    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": "/nonexistent"}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = move(e["value"])
        elif e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name":
            env[e["name"]] = name + "-0"
        elif e["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP":
            env[e["name"]] = "127.0.0.1"
    cmd = [vol(move(a)) for a in c["command"]] + list(extra_args)
    for old, new in port_overrides:
        cmd = [a.replace(old, new) for a in cmd]
    # $(VAR) references, as the kubelet expands them.
    cmd = [a.replace("$(POD_NAME)", env.get("POD_NAME", "")).replace("$(POD_IP)", env.get("POD_IP", ""))
           for a in cmd]
    assert psc["runAsNonRoot"] and csc["readOnlyRootFilesystem"] and not csc["allowPrivilegeEscalation"]
    assert csc["capabilities"]["drop"] == ["ALL"]
    setpriv = ["setpriv", f"--reuid={psc['runAsUser']}", f"--regid={psc['runAsGroup']}",
               f"--groups={psc['fsGroup']}", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    log = open(f"{work}/{name}.log", "w")
    procs[name] = (subprocess.Popen(setpriv + cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd="/"),
                   f"{work}/{name}.log")
    return c


def wait_for(cond, what, seconds):
    end = time.time() + seconds
    while time.time() < end:
        for name, (p, log) in procs.items():
            if p.poll() is not None:
                fail(f"{name} exited with {p.returncode} while waiting for {what}:\n" + open(log).read()[-3000:])
        if cond():
            return
        time.sleep(0.2)
    fail(f"timed out waiting for {what}")


def http(port, path, body=None, key=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 data=json.dumps(body).encode() if body is not None else None)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


try:
    # Redis: its own port here; the readiness probe as the manifest runs it.
    c = start("redis", [(" --port 6379 ", f" --port {redis_port} --bind 127.0.0.1 ")])
    probe = [a.replace("-p 6379", f"-p {redis_port}") for a in c["readinessProbe"]["exec"]["command"]]
    probe_env = {"PATH": "/usr/bin:/bin", "REDIS_PASSWORD_FILE": f"{work}/secrets/redis/password"}
    wait_for(lambda: subprocess.call(probe, env=probe_env, stderr=subprocess.DEVNULL) == 0,
             "Redis's readiness probe", 20)
    # Workers: ports of their own (each pod has its IP), one kernel thread.
    for name in ("decode", "prefill-b0"):
        start(name, extra_args=["--listen=127.0.0.1:0", "--metrics.host=127.0.0.1",
                                "--metrics.port=0", f"--port_file=/tmp/{name}.ports", "--threads=1"])
    router_ports = "/tmp/router.ports"  # in the emptyDir: the pods write only on volumes
    cfg = yaml.safe_load(open(f"{work}/etc/router.yaml"))
    cfg.update(listen="127.0.0.1:0", http={"host": "127.0.0.1", "port": 0})
    yaml.safe_dump(cfg, open(f"{work}/etc/router.yaml", "w"))
    start("router", extra_args=[f"--port_file={router_ports}"])
    wait_for(lambda: os.path.exists(router_ports), "the router's port file", 60)
    port = json.load(open(router_ports))["http_port"]
    wait_for(lambda: http(port, "/health")[0] == 200, "the router's /health (workers registered)", 120)
    request = {"model": "swaserve", "prompt": "And the LORD said unto", "max_tokens": 8}
    status, body = http(port, "/v1/completions", request)
    if status != 401:
        fail(f"a completion without a key got {status}")
    status, body = http(port, "/v1/completions", request, api_key)
    if status != 200:
        fail(f"completion with the key: {status} {body[:500]}")
    reply = json.loads(body)
    text = reply["choices"][0]["text"]
    if reply["usage"]["completion_tokens"] < 1:
        fail("no token generated: " + body[:500])
    for name, (p, log) in procs.items():
        p.send_signal(signal.SIGTERM)
    for name, (p, log) in procs.items():
        rc = p.wait(timeout=60)
        out = open(log).read()
        for bad in ("Read-only file system", "Permission denied", "EROFS", "EACCES"):
            if bad in out:
                fail(f"{name} logged '{bad}':\n" + out[-3000:])
        if rc != 0:
            fail(f"{name} exited with {rc} on SIGTERM:\n" + out[-3000:])
    print(f"redis, router, prefill-b0 and decode ran as their pods (uid 10001, no capabilities, "
          f"read-only root); a completion with the Secret's API key: {text!r}")
finally:
    for name, (p, log) in procs.items():
        if p.poll() is None:
            p.kill()
            p.wait()
