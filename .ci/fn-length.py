#!/usr/bin/env python3
"""Fails on any function longer than a limit outside tests, and lists them.

    python3 .ci/fn-length.py [--max LINES] [--allow FILE] [--skip DIR]... SRC_DIR...

For each `.rs` file under the folders given, it blanks comments and string literals (the stripper
of `import-cycles.py`, so Lua and SQL in raw strings do not count as code and braces in them do not
confuse it), finds every `fn` with a body, matches its braces and counts the lines from the `fn`
line to the closing brace. Functions inside a `#[cfg(test)]` item (a `mod tests { .. }`) are left
out: tests may be long, and so are folders given with `--skip` (the conformance suite's cases, which
are tests shipped for other backends to run). A function longer than `--max` (80) fails the check.

The allow-list (one `path::function` per line, `#` starts a comment) names long functions known
and being split: they are reported but do not fail. A line that names no long function any more
fails the check too, so the list is emptied as they go. Standard library only.
"""

import argparse
import importlib.util
import os
import re
import sys

_spec = importlib.util.spec_from_file_location(
    "import_cycles", os.path.join(os.path.dirname(os.path.abspath(__file__)), "import-cycles.py")
)
_cycles = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_cycles)
strip = _cycles.strip_comments_and_strings


def matching(text, i):
    """Index just past the brace that closes the one at `i`."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


def test_spans(text):
    """(start, end) of every item under `#[cfg(test)]` that has a body."""
    spans = []
    for m in re.finditer(r"#\[cfg\(test\)\]", text):
        k = m.end()
        # The item the attribute is on: up to its first `{` or `;`.
        while k < len(text) and text[k] not in "{;":
            k += 1
        if k < len(text) and text[k] == "{":
            spans.append((m.start(), matching(text, k)))
    return spans


def functions(text):
    """(name, first line, line count) of every `fn` with a body."""
    for m in re.finditer(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)", text):
        k, depth = m.end(), 0
        # The signature: up to the body's `{`, or a `;` (no body) outside brackets.
        while k < len(text):
            c = text[k]
            if c in "([<":
                depth += 1
            elif c in ")]>" and not (c == ">" and text[k - 1] == "-"):
                depth -= 1
            elif c == ";" and depth <= 0:
                break
            elif c == "{" and depth <= 0:
                break
            k += 1
        if k >= len(text) or text[k] != "{":
            continue
        end = matching(text, k)
        first = text.count("\n", 0, m.start()) + 1
        last = text.count("\n", 0, end - 1) + 1
        yield m.start(), m.group(1), first, last - first + 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max", type=int, default=80)
    ap.add_argument("--allow")
    ap.add_argument("--skip", action="append", default=[])
    ap.add_argument("dirs", nargs="+")
    args = ap.parse_args()
    allowed = set()
    if args.allow:
        with open(args.allow) as f:
            for line in f:
                line = line.split("#", 1)[0].strip()
                if line:
                    allowed.add(line)
    long = []
    for d in args.dirs:
        for root, dirs, files in os.walk(d):
            dirs.sort()
            if any(os.path.normpath(root).startswith(os.path.normpath(k)) for k in args.skip):
                continue
            for name in sorted(files):
                if not name.endswith(".rs"):
                    continue
                path = os.path.join(root, name)
                with open(path, encoding="utf-8") as f:
                    text = strip(f.read())
                spans = test_spans(text)
                for at, fname, line, count in functions(text):
                    if count > args.max and not any(a <= at < b for a, b in spans):
                        long.append((f"{path}::{fname}", line, count))
    failed = False
    seen = set()
    for key, line, count in long:
        seen.add(key)
        status = "allowed" if key in allowed else "TOO LONG"
        failed |= key not in allowed
        print(f"{status}: {key} (line {line}): {count} lines > {args.max}")
    for key in sorted(allowed - seen):
        print(f"stale allow-list line: {key} is no longer over {args.max} lines")
        failed = True
    if not failed:
        print(f"no function over {args.max} lines outside tests ({len(long)} allowed)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
