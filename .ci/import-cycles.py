#!/usr/bin/env python3
"""Fails on any import circle between the modules of a Rust crate, and prints it.

    python3 .ci/import-cycles.py [--allow FILE] CRATE_SRC_DIR...

For each source folder (`src` of the library, `examples/webhook-router/src` of the router) it reads
every `.rs` file as one module (`a.rs` and `a/mod.rs` are `a`, `a/b.rs` is `a::b`, `lib.rs` is the
crate root; `main.rs` beside a `lib.rs` is another crate and is left out), takes the paths each
module names (`use crate::...`, `use super::...`, `use self::...`, a child module named bare, and
`crate::x::` / `super::x::` paths in code; comments and strings are left out, so doc links are not
imports), and resolves each to the deepest module it names. A name a module re-exports
(`pub use x::Y`) is followed to where it comes from, so a facade (`lib.rs`, a `mod.rs`) does not tie
everything to everything. A `mod x;` declaration is not an import. Then it finds the strongly
connected components of the graph and prints one circle through each.

The allow-list (one circle per line, modules separated by ` -> `, e.g. `memory::handle ->
memory::lifecycle`; `#` starts a comment) names circles known and being fixed: a circle whose set
of modules is on a line does not fail the check. A line that names no circle any more fails it
too, so the list is emptied as the circles go. Standard library only.
"""

import argparse
import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_comments_and_strings(text):
    """Blanks comments, string and char literals (keeping newlines and lifetimes)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if text[i] == "\n":
                        out.append("\n")
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 260]) and not re.match(r"[A-Za-z0-9_]", text[i - 1:i] or " "):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'":
            # A char literal ('a', '\n', '\u{..}'); otherwise a lifetime, kept.
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:i + 12])
            if m:
                out.append("' '")
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def module_files(src):
    """Maps module path (tuple of segments; () is the crate root) to its file."""
    mods = {}
    has_lib = os.path.exists(os.path.join(src, "lib.rs"))
    for root, dirs, files in os.walk(src):
        dirs.sort()
        for f in sorted(files):
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(root, f), src)
            parts = rel[:-3].split(os.sep)
            if parts == ["lib"] or (parts == ["main"] and not has_lib):
                path = ()
            elif parts == ["main"] or parts[0] == "bin":
                continue
            elif parts[-1] == "mod":
                path = tuple(parts[:-1])
            else:
                path = tuple(parts)
            mods[path] = os.path.join(root, f)
    return mods


def expand_use_tree(tree):
    """`a::{b, c::{d, e@f}}` -> [["a", "b"], ["a", "c", "d"], ["a", "c", "e@f"]] (`@` marks an alias)."""
    tree = re.sub(r"\s+", "", tree)
    out = []

    def walk(prefix, s):
        # Split s at top-level commas.
        depth, start, items = 0, 0, []
        for k, ch in enumerate(s):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                items.append(s[start:k])
                start = k + 1
        items.append(s[start:])
        for item in items:
            if not item:
                continue
            brace = item.find("{")
            if brace >= 0 and item.endswith("}"):
                head = [p for p in item[:brace].split("::") if p]
                walk(prefix + head, item[brace + 1:-1])
                continue
            out.append(prefix + [p for p in item.split("::") if p])

    walk([], tree)
    return out


USE_RE = re.compile(r"\b(pub(?:\s*\([^)]*\))?\s+)?use\s+([^;]+);")
PATH_RE = re.compile(r"(?<![A-Za-z0-9_:])((?:crate|super|self)(?:\s*::\s*" + IDENT + r")+)")
INLINE_MOD_RE = re.compile(r"\bmod\s+(" + IDENT + r")\s*\{")


def inline_module_at(text):
    """For each offset's line: the inline module path (`mod tests { .. }`) it sits in."""
    spans = []
    for m in INLINE_MOD_RE.finditer(text):
        depth, k = 1, m.end()
        while k < len(text) and depth:
            if text[k] == "{":
                depth += 1
            elif text[k] == "}":
                depth -= 1
            k += 1
        spans.append((m.start(), k, m.group(1)))

    def at(offset):
        return tuple(name for (s, e, name) in spans if s <= offset < e)

    return at


def parse(src):
    mods = module_files(src)
    uses = {}  # module -> list of (segments, inline path)
    reexports = {}  # module -> {name: segments}
    for mod, path in mods.items():
        with open(path, encoding="utf-8") as fh:
            text = strip_comments_and_strings(fh.read())
        at = inline_module_at(text)
        found = []
        spans = []
        for m in USE_RE.finditer(text):
            spans.append((m.start(), m.end()))
            body = m.group(2)
            # Keep `as` aliases: `a::B as C` names C.
            body_aliases = re.sub(r"\s+as\s+(" + IDENT + r")", r"@\1", body)
            for segs in expand_use_tree(body_aliases):
                alias = None
                if segs and "@" in segs[-1]:
                    segs[-1], alias = segs[-1].split("@", 1)
                inline = at(m.start())
                reexport = bool(m.group(1)) and not inline
                found.append((segs, inline))
                if reexport and segs and segs[-1] not in ("*", "self"):
                    reexports.setdefault(mod, {})[alias or segs[-1]] = segs
        for m in PATH_RE.finditer(text):
            if any(s <= m.start() < e for s, e in spans):
                continue
            segs = [p.strip() for p in m.group(1).split("::")]
            found.append((segs, at(m.start())))
        uses[mod] = found
    return mods, uses, reexports


def resolve(mods, reexports, here, segs, depth=0):
    """The module that a path used in module `here` names, or None (another crate)."""
    segs = list(segs)
    if not segs:
        return None
    if segs[0] == "crate":
        base, rest = (), segs[1:]
    elif segs[0] in ("super", "self"):
        base = tuple(here)
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
        rest = segs
    elif tuple(here) + (segs[0],) in mods:
        base, rest = tuple(here), segs
    else:
        return None  # another crate (std, tokio, ...)
    target = base
    k = 0
    while k < len(rest) and target + (rest[k],) in mods:
        target = target + (rest[k],)
        k += 1
    if k < len(rest) and depth < 16:
        name = rest[k]
        again = reexports.get(target, {}).get(name)
        if again is not None:
            via = resolve(mods, reexports, target, again, depth + 1)
            if via is not None:
                return via
    return target


def graph(src):
    mods, uses, reexports = parse(src)
    edges = {m: set() for m in mods}
    for mod, found in uses.items():
        for segs, inline in found:
            here = mod + inline
            target = resolve(mods, reexports, here, segs)
            if target is None or target == mod:
                continue
            # A module using its own submodules (a `mod.rs` or `lib.rs` handing their names on, or
            # holding their types) uses its parts, as its `mod` lines say: not an import. A part
            # using its parent, or a sibling, is one.
            if target[: len(mod)] == mod:
                continue
            # An inline module's `super::` is its own file: not an edge.
            if target[: len(mod)] == mod and len(target) > len(mod) and target not in mods:
                continue
            edges[mod].add(target)
    return edges


def components(edges):
    """Tarjan's strongly connected components, iteratively."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


def one_circle(edges, comp):
    """A shortest circle through the component's first module."""
    start = min(comp)
    prev, frontier = {start: None}, [start]
    while frontier:
        nxt_frontier = []
        for node in frontier:
            for nxt in sorted(edges[node]):
                if nxt == start:
                    path = [node]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return list(reversed(path)) + [start]
                if nxt in comp and nxt not in prev:
                    prev[nxt] = node
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    return sorted(comp)


def name(mod):
    return "::".join(mod) if mod else "crate"


def read_allow(path):
    allowed = []
    if not path or not os.path.exists(path):
        return allowed
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.split("#", 1)[0].strip()
            if line:
                allowed.append((line, frozenset(p.strip() for p in line.split("->") if p.strip())))
    return allowed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--allow", help="allow-list file: one known circle per line")
    ap.add_argument("srcs", nargs="+", help="a crate's source folder (its lib.rs or main.rs)")
    args = ap.parse_args()
    allowed = read_allow(args.allow)
    used = set()
    failed = False
    for src in args.srcs:
        edges = graph(src)
        n_edges = sum(len(v) for v in edges.values())
        comps = components(edges)
        print(f"{src}: {len(edges)} modules, {n_edges} imports between them, {len(comps)} circle(s)")
        for comp in comps:
            names = frozenset(name(m) for m in comp)
            circle = " -> ".join(name(m) for m in one_circle(edges, comp))
            hit = [line for line, mods in allowed if mods == names]
            if hit:
                used.update(hit)
                print(f"  allowed (listed in {args.allow}): {circle}")
                continue
            failed = True
            print(f"  CIRCLE: {circle}")
            if len(comp) > 2:
                print("    (all modules tied in it: " + ", ".join(sorted(names)) + ")")
            for m in sorted(comp, key=name):
                into = sorted(name(t) for t in edges[m] if t in comp)
                print(f"    {name(m)} imports {', '.join(into)}")
    for line, _ in allowed:
        if line not in used:
            failed = True
            print(f"allow-list line names no circle any more, remove it from {args.allow}: {line}")
    if failed:
        print("import circles found: move the types several modules need below the code that uses them")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
