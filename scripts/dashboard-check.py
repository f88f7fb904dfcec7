#!/usr/bin/env python3
"""Checks a Grafana dashboard JSON against a live Prometheus.

Every PromQL expression in the dashboard's panels (rows' nested panels
included) is sent to PROMETHEUS/api/v1/query; one that errors or returns
no series fails, with its panel, refId and text printed. Grafana variables
are replaced first: a templated variable by its allValue (the dashboard's
"All"), $__rate_interval / $__interval / $__range by --interval, the
datasource variable is irrelevant to the query text. A variable the script
cannot resolve fails that expression (it would not work in Grafana either).

Usage: scripts/dashboard-check.py [--interval 30s] PROMETHEUS_URL DASHBOARD.json
Prints one line per expression, `PASS` or `FAIL`, then a count; exits 1 if
any failed, 2 if the file is not a dashboard Grafana can import.
"""

import argparse
import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request

# ${name}, ${name:format}, [[name]] and $name, as Grafana reads them.
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")
BUILTIN_INTERVALS = ("__rate_interval", "__interval", "__range")
QUERY_TIMEOUT_S = 10


def panels_of(dashboard):
    """Every panel, rows' collapsed children included."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def check_importable(dashboard):
    """The fields Grafana's import needs; returns a list of problems."""
    problems = []
    if not isinstance(dashboard.get("schemaVersion"), int):
        problems.append("no integer schemaVersion")
    if not dashboard.get("title"):
        problems.append("no title")
    ids = [p.get("id") for p in panels_of(dashboard)]
    if len(ids) != len(set(ids)) or None in ids:
        problems.append("panel ids missing or not unique")
    for panel in panels_of(dashboard):
        if panel.get("type") == "row":
            continue
        if "gridPos" not in panel or not panel.get("targets"):
            problems.append(f"panel {panel.get('title')!r}: no gridPos or no targets")
        for t in panel.get("targets", []):
            if not t.get("refId") or not t.get("expr"):
                problems.append(f"panel {panel.get('title')!r}: a target without refId or expr")
    return problems


def substitutions(dashboard, interval):
    values = {name: interval for name in BUILTIN_INTERVALS}
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "datasource":
            continue
        if var.get("includeAll") and var.get("allValue"):
            values[var["name"]] = var["allValue"]
    return values


def resolve(expr, values):
    """The expression with its variables replaced, and the names left unknown."""
    unknown = []

    def one(m):
        name = m.group(1) or m.group(2) or m.group(3)
        if name in values:
            return values[name]
        unknown.append(name)
        return m.group(0)

    return VARIABLE.sub(one, expr), unknown


def query(prometheus, expr):
    """The result list of an instant query; raises on an HTTP or PromQL error."""
    url = prometheus.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=QUERY_TIMEOUT_S) as resp:
            body = json.load(resp)
    except urllib.error.HTTPError as e:
        body = json.load(e)
    if body.get("status") != "success":
        raise RuntimeError(f"{body.get('errorType')}: {body.get('error')}")
    return body["data"]["result"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("prometheus")
    ap.add_argument("dashboard")
    ap.add_argument("--interval", default="30s", help="stands for $__rate_interval etc.")
    args = ap.parse_args()
    try:
        with open(args.dashboard) as f:
            dashboard = json.load(f)
    except (OSError, ValueError) as e:
        print(f"FAIL {args.dashboard} does not parse as JSON: {e}")
        return 2
    problems = check_importable(dashboard)
    if problems:
        for p in problems:
            print(f"FAIL {args.dashboard}: {p}")
        return 2
    values = substitutions(dashboard, args.interval)
    total = failed = 0
    for panel in panels_of(dashboard):
        for target in panel.get("targets", []):
            total += 1
            where = f"{panel['title']}/{target['refId']}"
            expr, unknown = resolve(target["expr"], values)
            if unknown:
                result, why = None, f"unknown variable(s) {', '.join(unknown)}"
            else:
                try:
                    result = query(args.prometheus, expr)
                    why = "no series" if not result else ""
                except (OSError, RuntimeError, ValueError) as e:
                    result, why = None, str(e)
            if why:
                failed += 1
                print(f"FAIL dashboard query {where}: {why}: {expr}")
            else:
                sample = result[0].get("value", [None, "?"])[1]
                print(f"PASS dashboard query {where}: {len(result)} series (first {sample}): {expr}")
    print(f"{total - failed}/{total} dashboard queries returned data")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
