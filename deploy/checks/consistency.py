#!/usr/bin/env python3
"""The facts the kit's files repeat, checked against each other and against the router.

    consistency.py static        the stop deadlines (grace period >= preStop + shutdown deadline +
                                 HANDOVER_S in the Deployment, the unit and the compose file), the
                                 secret files each one names (mounted, loaded or declared), the
                                 ports (probes, advertise URL, binds), the Secret template's
                                 placeholders, the kustomization's list, and the Dockerfile against Cargo (one `cp` per
                                 binary of the router's package; a Rust image at least the highest
                                 rust-version of its locked dependency tree)
    consistency.py env HELP      every WEBHOOK_ROUTER_* variable the kit sets is one the router
                                 reads (HELP: the output of `webhook-router --help`)

Exits 1 with one line per problem. Needs PyYAML (kubernetes-validate brings it) and, for `static`,
cargo.
"""

import configparser
import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "deploy"
DEPLOYMENT = KIT / "kubernetes/deployment.yaml"
SECRET = KIT / "kubernetes/secret.yaml"
UNIT = KIT / "systemd/webhook-router.service"
COMPOSE = KIT / "compose/compose.yaml"
DOCKERFILE = KIT / "docker/Dockerfile"
PACKAGE = "worker-registry-router"
WORKER_PACKAGE = "webhook-worker"
# After the shutdown deadline: each worker still running deregisters (its claims released through
# the registry for the other replicas), the report and the log are written, spans flushed.
HANDOVER_S = 10
ENV_NAME = re.compile(r"\bWEBHOOK_ROUTER_[A-Z0-9_]+\b")


def seconds(text):
    """`30s`, `1m30s`, `30` (seconds) as seconds."""
    if re.fullmatch(r"\d+", str(text)):
        return int(text)
    parts = re.findall(r"(\d+)(ms|s|m|h)", str(text))
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(int(n) * scale[u] for n, u in parts)


def port(addr):
    return int(re.search(r":(\d+)(/|$)", addr).group(1))


def container():
    d = yaml.safe_load(DEPLOYMENT.read_text())
    spec = d["spec"]["template"]["spec"]
    return spec, spec["containers"][0], {e["name"]: e for e in spec["containers"][0]["env"]}


def unit():
    u = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    u.optionxform = str
    # Repeated keys (Environment=, LoadCredential=) are kept, one per line.
    text = re.sub(r"^(\w+)=", lambda m: f"{m.group(1)}@{next(COUNTER)}=", UNIT.read_text(), flags=re.M)
    u.read_string(text)
    svc = {}
    for k, v in u["Service"].items():
        svc.setdefault(k.split("@")[0], []).append(v)
    env = dict(e.split("=", 1) for e in svc.get("Environment", []))
    return svc, env


COUNTER = iter(range(10**6))


def compose():
    c = yaml.safe_load(COMPOSE.read_text())
    return c, {n: s for n, s in c["services"].items() if n.startswith("router")}


def deadlines():
    errs, rows = [], []
    spec, c, env = container()
    pre = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    pre_s = seconds(pre[1]) if pre[:1] == ["sleep"] and len(pre) == 2 else 0
    rows.append(("kubernetes", pre_s, int(env["WEBHOOK_ROUTER_SHUTDOWN_MS"]["value"]) / 1000,
                 spec["terminationGracePeriodSeconds"]))
    svc, uenv = unit()
    rows.append(("systemd", 0, int(uenv["WEBHOOK_ROUTER_SHUTDOWN_MS"]) / 1000,
                 seconds(svc["TimeoutStopSec"][0])))
    if svc.get("KillSignal") != ["SIGTERM"]:
        errs.append(f"{UNIT.name}: KillSignal is {svc.get('KillSignal')}, not SIGTERM")
    for name, s in compose()[1].items():
        rows.append((f"compose {name}", 0, int(s["environment"]["WEBHOOK_ROUTER_SHUTDOWN_MS"]) / 1000,
                     seconds(s.get("stop_grace_period", "10s"))))
        if s.get("stop_signal", "SIGTERM") != "SIGTERM":
            errs.append(f"compose {name}: stop_signal is {s['stop_signal']}")
    for where, pre_s, shutdown, grace in rows:
        need = pre_s + shutdown + HANDOVER_S
        print(f"deadline  {where:20} preStop {pre_s:4.0f} s + shutdown {shutdown:4.0f} s + handover "
              f"{HANDOVER_S} s = {need:4.0f} s <= grace {grace} s")
        if grace < need:
            errs.append(f"{where}: a grace period of {grace} s is under {need:g} s")
    return errs


def secret_files():
    """Every *_FILE variable names a file its platform provides."""
    errs = []
    _, c, env = container()
    secret = yaml.safe_load(SECRET.read_text())
    keys = set(secret.get("stringData", {}))
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in container()[0]["volumes"]}
    for name, e in env.items():
        if not name.endswith("_FILE"):
            continue
        path = Path(e["value"])
        vol = volumes.get(mounts.get(str(path.parent), ""), {})
        if vol.get("secret", {}).get("secretName") != secret["metadata"]["name"] or path.name not in keys:
            errs.append(f"kubernetes: {name}={path} is not a key of the mounted Secret")
    for k, v in secret.get("stringData", {}).items():
        if "REPLACE" not in v:
            errs.append(f"{SECRET.name}: `{k}` holds a value, not a REPLACE placeholder")
    svc, uenv = unit()
    creds = {c.split(":", 1)[0] for c in svc.get("LoadCredential", [])}
    for name, v in uenv.items():
        if name.endswith("_FILE") and not (v.startswith("%d/") and v[3:] in creds):
            errs.append(f"systemd: {name}={v} is not a LoadCredential= of the unit")
    top, routers = compose()
    for sname, s in routers.items():
        mine = set(s.get("secrets", []))
        for name, v in s["environment"].items():
            if name.endswith("_FILE") and not (v.startswith("/run/secrets/") and v[13:] in mine
                                               and v[13:] in top.get("secrets", {})):
                errs.append(f"compose {sname}: {name}={v} is not one of its secrets")
    return errs


def ports():
    errs = []
    _, c, env = container()
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    if named.get("webhook") != port(env["WEBHOOK_ROUTER_BIND"]["value"]):
        errs.append("kubernetes: the `webhook` port is not WEBHOOK_ROUTER_BIND's")
    if named.get("admin") != port(env["WEBHOOK_ROUTER_ADMIN_BIND"]["value"]):
        errs.append("kubernetes: the `admin` port is not WEBHOOK_ROUTER_ADMIN_BIND's")
    if port(env["WEBHOOK_ROUTER_ADVERTISE_URL"]["value"]) != named.get("webhook"):
        errs.append("kubernetes: the advertise URL's port is not the webhook port")
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        if c[probe]["httpGet"]["port"] != "admin":
            errs.append(f"kubernetes: {probe} is not on the admin port")
    if c["readinessProbe"]["httpGet"]["path"] != "/readyz":
        errs.append("kubernetes: the readiness probe is not GET /readyz")
    for sname, s in compose()[1].items():
        e = s["environment"]
        if port(e["WEBHOOK_ROUTER_ADVERTISE_URL"]) != port(e["WEBHOOK_ROUTER_BIND"]):
            errs.append(f"compose {sname}: the advertise URL's port is not the bind's")
        if f"//{sname}:" not in e["WEBHOOK_ROUTER_ADVERTISE_URL"]:
            errs.append(f"compose {sname}: the advertise URL does not name the service")
    return errs


def kustomization():
    """The kustomization lists every manifest of the folder."""
    k = yaml.safe_load((KIT / "kubernetes/kustomization.yaml").read_text())
    files = sorted(p.name for p in (KIT / "kubernetes").glob("*.yaml") if p.name != "kustomization.yaml")
    if sorted(k.get("resources", [])) != files:
        return [f"kustomization.yaml lists {sorted(k.get('resources', []))}, the folder has {files}"]
    return []


def dockerfile():
    errs = []
    text = DOCKERFILE.read_text()
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked", "--no-deps"],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout)
    pkg = next(p for p in meta["packages"] if p["name"] == PACKAGE)
    # The router's binaries, and the ready-made worker its process launcher starts next to it.
    bins = sorted(t["name"] for p in meta["packages"] if p["name"] in (PACKAGE, WORKER_PACKAGE)
                  for t in p["targets"] if "bin" in t["kind"])
    copied = sorted(re.findall(r"cp target/release/([\w-]+) /out/", text))
    if bins != copied:
        errs.append(f"Dockerfile: the build stage copies {copied}, the package has binaries {bins}")
    m = re.search(r"ARG RUST_IMAGE=rust:(\d+)\.(\d+)", text)
    have = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    need, who = floor_rust_version(pkg)
    print(f"dockerfile  binaries {copied}; rust:{have[0]}.{have[1]} for rust-version {need[0]}.{need[1]} ({who})")
    if have < need:
        errs.append(f"Dockerfile: rust:{have[0]}.{have[1]} is older than {who}'s rust-version {need[0]}.{need[1]}")
    return errs


def floor_rust_version(pkg):
    """The highest rust-version in the router's locked normal and build dependencies on Linux."""
    tree = subprocess.run(
        ["cargo", "tree", "-p", PACKAGE, "-e", "normal,build", "--locked", "--prefix", "none",
         "--target", "x86_64-unknown-linux-gnu", "-f", "{p}"],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout
    used = {tuple(line.split()[:2]) for line in tree.splitlines() if line.strip()}
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked",
         "--filter-platform", "x86_64-unknown-linux-gnu"],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout)
    best = ((0, 0), "")
    for p in meta["packages"]:
        if (p["name"], "v" + p["version"]) in used and p.get("rust_version"):
            v = tuple(int(x) for x in p["rust_version"].split(".")[:2])
            best = max(best, (v, f"{p['name']} {p['version']}"))
    own = tuple(int(x) for x in (pkg.get("rust_version") or "0.0").split(".")[:2])
    return max(best, (own, PACKAGE))


def env_names(help_path):
    """The variables the kit sets (commented-out settings included, prose left out)."""
    reads = set(ENV_NAME.findall(Path(help_path).read_text()))
    sets = [
        (DEPLOYMENT, r"name: (WEBHOOK_ROUTER_\w+)"),
        (UNIT, r"(WEBHOOK_ROUTER_\w+)="),
        (COMPOSE, r"^\s+(WEBHOOK_ROUTER_\w+):"),
        (DOCKERFILE, r"(WEBHOOK_ROUTER_\w+)="),
        (KIT / "docker/probe", r"\$\{(WEBHOOK_ROUTER_\w+)"),
    ]
    errs, n = [], 0
    for f, pattern in sets:
        names = sorted(set(re.findall(pattern, f.read_text(), flags=re.M)))
        n += len(names)
        for name in names:
            if name not in reads:
                errs.append(f"{f.relative_to(ROOT)}: the router reads no {name}")
    print(f"env  {n} settings in {len(sets)} files; the router reads {len(reads)} WEBHOOK_ROUTER_* variables")
    return errs


def main():
    if sys.argv[1:] == ["static"]:
        errs = deadlines() + secret_files() + ports() + kustomization() + dockerfile()
    elif sys.argv[1:2] == ["env"] and len(sys.argv) == 3:
        errs = env_names(sys.argv[2])
    else:
        sys.exit(__doc__)
    for e in errs:
        print(e)
    print(f"{sys.argv[1]}: {len(errs)} problems")
    sys.exit(1 if errs else 0)


if __name__ == "__main__":
    main()
