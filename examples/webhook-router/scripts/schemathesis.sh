#!/usr/bin/env bash
# Opt-in: schemathesis (PyPI) against a running router, driven by its own /openapi.json: every
# operation, POST /webhook included, with generated and negative inputs and all of schemathesis'
# checks. `cargo test` runs the Rust counterpart (tests/openapi.rs); this goes wider and slower.
#
#   bash examples/webhook-router/scripts/schemathesis.sh            # about a minute
#   MAX_EXAMPLES=500 bash examples/webhook-router/scripts/schemathesis.sh
#
# It installs schemathesis with pip if it is missing, builds the router, starts it on a free
# loopback port (unsigned deliveries, which only a loopback bind allows, so generated bodies need
# no HMAC; no admin token, so the admin reads are reachable), runs, and stops it.
set -euo pipefail
cd "$(dirname "$0")/../../.."
command -v schemathesis >/dev/null || python3 -m pip install --quiet --root-user-action=ignore schemathesis
cargo build -q -p worker-registry-router
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
./target/debug/webhook-router --bind "127.0.0.1:$port" --heartbeat-ms 1000 --work-ms 20 >/tmp/webhook-router-schemathesis.log 2>&1 &
router=$!
trap 'kill "$router" 2>/dev/null || true' EXIT
for _ in $(seq 50); do
  curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break
  sleep 0.1
done
# positive_data_acceptance is left out: a request body can be valid for the schema (any JSON object)
# and still not be what its event promises (`pull_request` without `pull_request.number`), which the
# router rightly answers 400, as documented.
schemathesis run "http://127.0.0.1:$port/openapi.json" \
  --checks all \
  --exclude-checks positive_data_acceptance \
  --max-examples "${MAX_EXAMPLES:-100}" \
  --workers 2 \
  "$@"
