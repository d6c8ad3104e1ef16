#!/usr/bin/env python3
"""What `cargo package` would publish, checked: the file list of each published crate, and the
links of the README that crates.io shows.

For worker-registry and worker-registry-router, `cargo package --list`:

* holds only what a user needs: the manifest, the README, the licences (and the library's
  CHANGELOG), `src/**`, and what cargo adds (`Cargo.lock`, `Cargo.toml.orig`,
  `.cargo_vcs_info.json`): no `.ci/`, benches, tests, test fixtures, the schemathesis cache, or
  another crate's files;
* holds every file git tracks under the crate's `src/` (a migration, a Lua script or a doc page
  left out would build here and break for users);
* holds the files a user must have: the licences, the README, the library's CHANGELOG.

Each README must have no relative link: crates.io resolves one only against a `repository`,
which the project does not have yet (links are absolute docs.rs ones; `#anchors` are fine).

    python3 .ci/package.py [--allow-dirty]
"""

import argparse
import fnmatch
import re
import subprocess
import sys

CRATES = {
    # name: (directory, files it must hold besides src/**)
    "worker-registry": (".", ["Cargo.toml", "README.md", "LICENSE-MIT", "LICENSE-APACHE", "CHANGELOG.md"]),
    "worker-registry-router": (
        "examples/webhook-router",
        ["Cargo.toml", "README.md", "LICENSE-MIT", "LICENSE-APACHE"],
    ),
}
# What cargo adds to every package.
GENERATED = {"Cargo.lock", "Cargo.toml.orig", ".cargo_vcs_info.json"}
ALLOWED = ["Cargo.toml", "README.md", "LICENSE-MIT", "LICENSE-APACHE", "CHANGELOG.md", "src/*"]


def listed(name, allow_dirty):
    cmd = ["cargo", "package", "--list", "--quiet", "-p", name]
    if allow_dirty:
        cmd.append("--allow-dirty")
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return {line.strip() for line in out.splitlines() if line.strip()}


def tracked_sources(directory):
    out = subprocess.run(
        ["git", "ls-files", "--", "src"],
        cwd=directory,
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    return {line.strip() for line in out.splitlines() if line.strip()}


def relative_links(readme):
    """Markdown links and reference definitions whose target is neither absolute nor an anchor."""
    with open(readme) as f:
        text = f.read()
    # Code blocks hold no links.
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    targets += re.findall(r"^\[[^\]]+\]:\s*(\S+)", text, flags=re.M)
    return [t for t in targets if not re.match(r"^(https?://|mailto:|#)", t)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--allow-dirty", action="store_true", help="pass --allow-dirty to cargo")
    args = ap.parse_args()
    failures = []
    for name, (directory, required) in CRATES.items():
        files = listed(name, args.allow_dirty)
        for f in sorted(files - GENERATED):
            if not any(fnmatch.fnmatch(f, pattern) for pattern in ALLOWED):
                failures.append(f"{name}: ships {f}, which a user does not need")
        for f in required:
            if f not in files:
                failures.append(f"{name}: does not ship {f}")
        for f in sorted(tracked_sources(directory) - files):
            failures.append(f"{name}: leaves out {f}, which git tracks under src/")
        for link in relative_links(f"{directory}/README.md"):
            failures.append(
                f"{name}: README.md links to {link!r}, which breaks on crates.io (no repository "
                "to resolve it against): make it an absolute docs.rs link"
            )
        print(f"{name}: {len(files)} files")
    for f in failures:
        print(f"error: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
