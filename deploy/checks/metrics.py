#!/usr/bin/env python3
"""The metric names of the deployment kit, checked against what the router documents and exports.

    metrics.py documented         every metric that the Grafana dashboard and the alert rules name
                                  is in a documented metric table (the library's src/metrics/mod.rs
                                  and src/docs/admin.md, the router's src/metrics.rs), and the
                                  dashboard has what Grafana needs to import it
    metrics.py scraped FILE       and a running router's /metrics (FILE, the text format) has a
                                  series for every selector they use, label values included

Exits 1 with one line per problem. Needs PyYAML (kubernetes-validate brings it) and, for
`scraped`, prometheus_client (.ci/run installs both).
"""

import json
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    ROOT / "src/metrics/mod.rs",
    ROOT / "src/docs/admin.md",
    ROOT / "examples/webhook-router/src/metrics.rs",
]
DASHBOARD = ROOT / "deploy/grafana/webhook-router.json"
RULES = ROOT / "deploy/prometheus/alerts.yaml"
FAMILIES = ("worker_registry", "webhook_router")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# Labels a scrape does not carry: Prometheus adds them from the target.
TARGET_LABELS = {"job", "instance", "namespace", "pod"}
PROMQL_WORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "offset", "inf", "nan",
}
PANEL_TYPES = {"row", "timeseries", "stat", "table", "gauge", "bargauge", "heatmap", "text"}


def expand_braces(name):
    """`a_{b,c}_d` -> [`a_b_d`, `a_c_d`]."""
    m = re.search(r"\{([^{}]*)\}", name)
    if not m:
        return [name]
    return [
        n
        for alt in m.group(1).split(",")
        for n in expand_braces(name[: m.start()] + alt + name[m.end():])
    ]


def abbreviations(first, short):
    """`_limit` after `worker_registry_capacity_used`: the name `short` ends, on every underscore
    boundary of `first` past its family prefix (the tables abbreviate with the shared part left
    out, and do not say how much is shared)."""
    family = next((f for f in FAMILIES if first.startswith(f + "_")), None)
    if family is None:
        return []
    cuts = [i for i, c in enumerate(first) if c == "_" and i >= len(family)]
    return [first[:i] + short for i in cuts]


def documented():
    """{name: type} from the first column (and the type column) of every metric table."""
    names = {}
    for path in DOCS:
        for line in path.read_text().splitlines():
            line = re.sub(r"^\s*//!\s?", "", line)
            if not line.startswith("|"):
                continue
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) < 2:
                continue
            kind = cells[1].split()[0] if cells[1] else ""
            tokens = re.findall(r"`([a-z_{},]+)`", cells[0])
            full = [t for t in tokens if t.startswith(FAMILIES)]
            if not full:
                continue
            for t in tokens:
                for n in expand_braces(t):
                    expanded = abbreviations(expand_braces(full[0])[0], n) if n.startswith("_") else [n]
                    for e in expanded:
                        names[e] = kind
    return names


def strip_promql(expr):
    """The expression without strings, matchers, label lists, ranges and Grafana variables."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    expr = re.sub(r"\{[^{}]*\}", "{}", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    return re.sub(r"\$\{?\w+\}?", " ", expr)


def metric_names(expr):
    """The metric names an expression selects (identifiers that are not functions or keywords)."""
    out = []
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", strip_promql(expr)):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in PROMQL_WORDS:
            continue
        out.append(name)
    return out


def selectors(expr):
    """(name, [(label, op, value)]) for every selector of an expression."""
    clean = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", expr)
    found = []
    for m in re.finditer(r"(?<![\w.$])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{([^{}]*)\})?", clean):
        name, body = m.group(1), m.group(3) or ""
        if name.lower() in PROMQL_WORDS or clean[m.end():].lstrip().startswith("("):
            continue
        matchers = re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"', body)
        found.append((name, matchers))
    return [s for s in found if s[0] in metric_names(expr)]


def panels(dashboard):
    for p in dashboard.get("panels", []):
        yield p
        yield from p.get("panels", [])


def expressions():
    """(where, expr) for every query of the dashboard and every alert rule."""
    d = json.loads(DASHBOARD.read_text())
    for p in panels(d):
        for t in p.get("targets", []):
            yield f"dashboard panel {p.get('id')} {t.get('refId')}", t.get("expr", "")
    for v in d.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query", "") if isinstance(q, dict) else (q or "")
        m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\)\s*", q)
        if m:
            yield f"dashboard variable {v.get('name')}", m.group(1)
    for g in yaml.safe_load(RULES.read_text())["groups"]:
        for r in g["rules"]:
            yield f"rule {r.get('alert') or r.get('record')}", r["expr"]


def resolve(name, docs):
    """The documented name `name` is, or None."""
    if name in docs:
        return name
    for suffix in HISTOGRAM_SUFFIXES:
        base = name[: -len(suffix)] if name.endswith(suffix) else None
        if base and docs.get(base) == "histogram":
            return base
    return None


def dashboard_problems():
    """What Grafana needs to import the dashboard: its fields, unique panel ids, a grid that fits
    24 columns without overlaps, and every query on the dashboard's data source variable."""
    d = json.loads(DASHBOARD.read_text())
    errs = []
    for key, kind in [("title", str), ("uid", str), ("schemaVersion", int), ("panels", list),
                      ("templating", dict), ("time", dict)]:
        if not isinstance(d.get(key), kind):
            errs.append(f"dashboard: `{key}` missing or not a {kind.__name__}")
    variables = {v.get("name") for v in d.get("templating", {}).get("list", [])}
    if "datasource" not in variables:
        errs.append("dashboard: no `datasource` variable")
    ids, cells = set(), {}
    for p in panels(d):
        pid = p.get("id")
        if not isinstance(pid, int) or pid in ids:
            errs.append(f"dashboard: panel id {pid!r} missing or repeated")
        ids.add(pid)
        if p.get("type") not in PANEL_TYPES or not p.get("title"):
            errs.append(f"dashboard: panel {pid}: type {p.get('type')!r} or title missing")
        g = p.get("gridPos", {})
        if not all(isinstance(g.get(k), int) for k in "xywh") or g["x"] + g["w"] > 24:
            errs.append(f"dashboard: panel {pid}: gridPos {g} is not within 24 columns")
            continue
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                if (x, y) in cells:
                    errs.append(f"dashboard: panel {pid} overlaps panel {cells[(x, y)]}")
                    break
                cells[(x, y)] = pid
            else:
                continue
            break
        for t in p.get("targets", []):
            if not t.get("refId") or not t.get("expr"):
                errs.append(f"dashboard: panel {pid}: a target without refId or expr")
            if t.get("datasource", {}).get("uid") != "${datasource}":
                errs.append(f"dashboard: panel {pid}: a target not on ${{datasource}}")
        if p.get("type") != "row" and not p.get("targets") and p.get("type") != "text":
            errs.append(f"dashboard: panel {pid}: no query")
    return errs


def check_documented():
    docs = documented()
    errs = dashboard_problems()
    for where, expr in expressions():
        names = metric_names(expr)
        if not names:
            errs.append(f"{where}: names no metric: {expr}")
        for n in names:
            if resolve(n, docs) is None:
                errs.append(f"{where}: `{n}` is not in a documented metric table")
    return errs


def check_scraped(path):
    from prometheus_client.parser import text_string_to_metric_families

    series = {}
    for family in text_string_to_metric_families(Path(path).read_text()):
        for s in family.samples:
            series.setdefault(s.name, []).append(s.labels)
    errs = []
    for where, expr in expressions():
        for name, matchers in selectors(expr):
            if name not in series:
                errs.append(f"{where}: the router exports no `{name}`")
                continue
            for label, op, value in matchers:
                if label in TARGET_LABELS or "$" in value or op not in ("=", "=~"):
                    continue
                wanted = value.split("|") if re.fullmatch(r"[\w|]+", value) else []
                if op == "=":
                    wanted = [value]
                for v in wanted:
                    if not any(ls.get(label) == v for ls in series[name]):
                        errs.append(f'{where}: the router exports no `{name}{{{label}="{v}"}}`')
    return errs


def main():
    if sys.argv[1:2] == ["documented"]:
        errs = check_documented()
    elif sys.argv[1:2] == ["scraped"] and len(sys.argv) == 3:
        errs = check_scraped(sys.argv[2])
    else:
        sys.exit(__doc__)
    for e in sorted(set(errs)):
        print(e)
    n = sum(1 for _ in expressions())
    print(f"{sys.argv[1]}: {n} expressions, {len(set(errs))} problems")
    sys.exit(1 if errs else 0)


if __name__ == "__main__":
    main()
