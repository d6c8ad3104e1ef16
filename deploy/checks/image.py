#!/usr/bin/env python3
"""The image run as an orchestrator runs it: `image.py IMAGE` (Docker reached through DOCKER_HOST).

Starts IMAGE on the host's network with its secrets as read-only files and the probe addresses
of the Deployment (admin API on its own port), then checks, in order:

  1. GET /readyz on the admin address answers 200, and Docker's HEALTHCHECK (the image's probe)
     turns the container healthy;
  2. PID 1 is tini, the router runs as uid 10001, and the Deployment's preStop command exists;
  3. a signed delivery is accepted (202 assigned);
  4. then /metrics (with the admin token) has every series the dashboard and the alerts select
     (deploy/checks/metrics.py scraped; after a delivery, so that histograms with labels have one);
     the delivery's work is still running when `docker stop` sends SIGTERM, and /readyz answers
     503 while the router drains;
  5. the container exits with status 0 (the work completed: nothing left unfinished), within the
     grace `docker stop -t` gives it, and every line it logged is a JSON object.

Exits 1 at the first failed step, with the container's log.
"""

import hashlib
import hmac
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import yaml

sys.dont_write_bytecode = True  # no __pycache__ left in the checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))
import metrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SECRETS = "/run/secrets/webhook-router"
# Long enough that the delivery is still being worked on when SIGTERM arrives.
WORK_MS = 4000
# Waits for something the router does at once; they bound a hang, they do not measure speed.
PATIENCE_S = 60
STOP_GRACE_S = 30


def docker(*args, check=True):
    r = subprocess.run(["docker", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise Failure(f"docker {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout.strip()


class Failure(Exception):
    pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, token=None):
    """(status, body) of GET url; status 0 when nothing answers."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, ConnectionError, socket.timeout):
        return 0, ""


def until(what, fn, cid):
    """Polls fn() until it returns a true value; fails if the container stops or after PATIENCE_S."""
    deadline = time.monotonic() + PATIENCE_S
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        if docker("inspect", "-f", "{{.State.Running}}", cid) != "true":
            raise Failure(f"the container stopped while waiting for {what}")
        time.sleep(0.2)
    raise Failure(f"no {what} within {PATIENCE_S} s")


def deliver(port, secret, number):
    body = json.dumps({
        "action": "opened",
        "number": number,
        "pull_request": {"number": number, "title": "t", "head": {"sha": "0" * 40}},
        "repository": {"full_name": "acme/api"},
        "sender": {"login": "mona"},
    }).encode()
    sig = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/webhook", data=body, method="POST", headers={
        "Content-Type": "application/json",
        "X-GitHub-Event": "pull_request",
        "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-Hub-Signature-256": f"sha256={sig}",
    })
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def start(image, secrets_dir, port, admin):
    return docker(
        "run", "-d", "--network", "host",
        "-v", f"{secrets_dir}:{SECRETS}:ro",
        "-e", f"WEBHOOK_ROUTER_BIND=127.0.0.1:{port}",
        "-e", f"WEBHOOK_ROUTER_ADMIN_BIND=127.0.0.1:{admin}",
        "-e", f"WEBHOOK_ROUTER_WEBHOOK_SECRET_FILE={SECRETS}/webhook-secret",
        "-e", f"WEBHOOK_ROUTER_ADMIN_TOKEN_FILE={SECRETS}/admin-token",
        "-e", f"WEBHOOK_ROUTER_WORK_MS={WORK_MS}",
        # CI's binary is the tests' build, which has the `otel` feature: no exporter, as without it.
        "-e", "OTEL_TRACES_EXPORTER=none",
        "--health-interval", "1s", "--health-start-period", "30s",
        image)


def steps(cid, port, admin, secret, token):
    ready = f"http://127.0.0.1:{admin}/readyz"
    status, body = until("answer on GET /readyz", lambda: (lambda r: r if r[0] else None)(get(ready)), cid)
    if status != 200:
        raise Failure(f"GET /readyz answered {status}: {body[:200]}")
    print("ok  GET /readyz on the admin address: 200")
    until("healthy HEALTHCHECK", lambda: docker("inspect", "-f", "{{.State.Health.Status}}", cid) == "healthy", cid)
    print("ok  HEALTHCHECK (the image's probe): healthy")

    pid1 = docker("exec", cid, "cat", "/proc/1/cmdline").split("\0")
    uid = docker("exec", cid, "id", "-u")
    pre = yaml.safe_load((ROOT / "deploy/kubernetes/deployment.yaml").read_text())
    pre = pre["spec"]["template"]["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    found = docker("exec", cid, "sh", "-c", f"command -v {pre[0]}", check=False)
    if pid1[0] != "/usr/bin/tini" or uid != "10001" or not found:
        raise Failure(f"PID 1 is {pid1[0]}, uid {uid}, preStop's {pre[0]}: {found or 'missing'}")
    print(f"ok  PID 1 {pid1[0]}, uid {uid}, preStop command {found}")

    status, answer = deliver(port, secret, 1)
    if status != 202 or answer.get("outcome") != "assigned":
        raise Failure(f"a signed delivery was answered {status}: {answer}")
    print(f"ok  a signed delivery: 202 assigned to worker {answer.get('worker')}, working {WORK_MS} ms")

    status, text = get(f"http://127.0.0.1:{admin}/metrics", token)
    with tempfile.NamedTemporaryFile("w", suffix=".prom", delete=False) as f:
        f.write(text)
    errs = [f"GET /metrics answered {status}"] if status != 200 else metrics.check_scraped(f.name)
    os.unlink(f.name)
    if errs:
        raise Failure("the scrape lacks what the kit selects:\n  " + "\n  ".join(errs))
    print("ok  /metrics has every series the dashboard and the alerts select")

    stop = subprocess.Popen(["docker", "stop", "-t", str(STOP_GRACE_S), cid], stdout=subprocess.DEVNULL)
    until("503 on GET /readyz after SIGTERM", lambda: get(ready)[0] == 503, cid)
    print("ok  after SIGTERM (docker stop): GET /readyz 503 while it drains")
    stop.wait()
    code = docker("inspect", "-f", "{{.State.ExitCode}}", cid)
    if code != "0":
        raise Failure(f"docker stop: the container exited with status {code}, not 0")
    print("ok  exit status 0 after docker stop: the accepted delivery was completed")

    logs = subprocess.run(["docker", "logs", cid], capture_output=True, text=True)
    lines = [l for l in (logs.stdout + logs.stderr).splitlines() if l.strip()]
    bad = []
    for l in lines:
        try:
            if not isinstance(json.loads(l), dict):
                bad.append(l)
        except ValueError:
            bad.append(l)
    if bad or not lines:
        raise Failure(f"{len(bad)} of {len(lines)} log lines are not JSON objects, e.g. {bad[:1]}")
    print(f"ok  {len(lines)} log lines, each a JSON object")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    image = sys.argv[1]
    secret, token = uuid.uuid4().hex, uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as d:
        for name, value in [("webhook-secret", secret), ("admin-token", token)]:
            p = Path(d, name)
            p.write_text(value + "\n")
            p.chmod(0o444)
        Path(d).chmod(0o755)
        port, admin = free_port(), free_port()
        cid = start(image, d, port, admin)
        try:
            steps(cid, port, admin, secret, token)
        except Failure as e:
            print(f"FAILED: {e}")
            print("--- the container's log (last 40 lines)")
            subprocess.run(["docker", "logs", "--tail", "40", cid])
            sys.exit(1)
        finally:
            docker("rm", "-f", cid, check=False)


if __name__ == "__main__":
    main()
