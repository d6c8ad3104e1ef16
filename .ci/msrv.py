#!/usr/bin/env python3
"""The declared MSRV against the lockfile: fails when it is not the oldest rustc every locked
dependency of a published package accepts.

For each package that is published (worker-registry, worker-registry-router), walks its normal
and build dependencies as Cargo.lock resolves them with every feature on (`cargo metadata
--locked --all-features`, all platforms; dev-dependencies and the loom cfg's are not a user's),
and compares the highest `rust-version` among them with the package's own `rust-version`:

* a dependency that needs a newer rustc than declared fails (a user on the declared toolchain
  could not build it), naming the dependency and the path to it;
* a declared version above everything the dependencies need also fails: the MSRV would not be
  the oldest that works. (The crate's own use of newer std APIs is clippy's `incompatible_msrv`
  lint, which reads the same `rust-version`; `.ci/run` runs clippy with `-D warnings`.)

    python3 .ci/msrv.py                 # the check
    python3 .ci/msrv.py --metadata F    # the same on a saved `cargo metadata` answer (tests)
"""

import argparse
import json
import subprocess
import sys

PUBLISHED = ("worker-registry", "worker-registry-router")
# Dependencies only under these target cfgs are the tests', not a user's.
TEST_ONLY_TARGETS = ("cfg(worker_registry_loom)",)


def version(text):
    """`1.88` or `1.88.0` as a comparable tuple (missing parts are 0)."""
    parts = [int(p) for p in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def shown(v):
    return ".".join(str(p) for p in v[:2]) if v[2] == 0 else ".".join(map(str, v))


def metadata(path):
    if path:
        with open(path) as f:
            return json.load(f)
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked", "--all-features"],
        check=True,
        stdout=subprocess.PIPE,
    ).stdout
    return json.loads(out)


def user_edges(node):
    """The node's dependencies a user builds: normal and build, not dev nor test-only cfgs."""
    for dep in node["deps"]:
        for kind in dep["dep_kinds"]:
            if kind["kind"] in (None, "build") and kind["target"] not in TEST_ONLY_TARGETS:
                yield dep["pkg"]
                break


def check(meta):
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    members = [packages[i] for i in meta["workspace_members"]]
    failures = []
    for root in (m for m in members if m["name"] in PUBLISHED):
        declared = root.get("rust_version")
        if not declared:
            failures.append(f"{root['name']}: no rust-version declared")
            continue
        declared = version(declared)
        # Breadth-first, remembering how each package was reached (for the message).
        via = {root["id"]: None}
        queue = [root["id"]]
        while queue:
            current = queue.pop(0)
            for dep in user_edges(nodes[current]):
                if dep not in via:
                    via[dep] = current
                    queue.append(dep)
        needs = []
        for pid in via:
            if pid == root["id"] or not packages[pid].get("rust_version"):
                continue
            needs.append((version(packages[pid]["rust_version"]), pid))
        needs.sort(reverse=True)
        highest = needs[0][0] if needs else (0, 0, 0)

        def path(pid):
            chain = []
            while pid is not None:
                chain.append(f"{packages[pid]['name']} {packages[pid]['version']}")
                pid = via[pid]
            return " <- ".join(chain)

        too_new = [(v, pid) for v, pid in needs if v > declared]
        print(
            f"{root['name']}: rust-version {shown(declared)}; {len(via) - 1} locked "
            f"dependencies, the highest rust-version among them {shown(highest)} "
            f"({', '.join(packages[p]['name'] for v, p in needs if v == highest)})"
        )
        for v, pid in too_new:
            failures.append(
                f"{root['name']}: declares rust-version {shown(declared)}, but the locked "
                f"{path(pid)} needs {shown(v)}"
            )
        if not too_new and declared > highest:
            failures.append(
                f"{root['name']}: declares rust-version {shown(declared)}, but no locked "
                f"dependency needs more than {shown(highest)}: declare {shown(highest)} (the "
                f"oldest toolchain the dependencies accept)"
            )
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--metadata", help="a saved `cargo metadata` answer instead of running it")
    args = ap.parse_args()
    failures = check(metadata(args.metadata))
    for f in failures:
        print(f"error: {f}", file=sys.stderr)
    if failures:
        print(
            "the MSRV check failed: raise or lower `rust-version` in Cargo.toml (the library's "
            "and the router's), or pin the dependency to a version that accepts the declared one",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
