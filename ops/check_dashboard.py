#!/usr/bin/env python3
"""Evaluates every query of ops/dashboard.json against a Prometheus and fails if one returns no data.

    python3 ops/check_dashboard.py PROMETHEUS_URL CONSUMER [--wait SECS] [--require METRIC ...]

Each panel target's `expr` is sent to `/api/v1/query` with `$consumer` replaced by CONSUMER and
`$__rate_interval` by `1m`. A query fails when its result is empty or holds a value that is not a finite number
(NaN, +Inf). `--require` names metrics that must have a real series for CONSUMER (not a dashboard's
`or on() vector(0)` fallback), which proves the scrape itself. Queries are retried until all pass or `--wait`
seconds (default 30) have passed. Standard library only; exit status 0 when everything has data.
"""

import argparse
import json
import math
import pathlib
import sys
import time
import urllib.parse
import urllib.request

DASHBOARD = pathlib.Path(__file__).resolve().parent / "dashboard.json"


def queries(dashboard):
    """(panel title, expr) for every target of every panel, rows' nested panels included."""
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((p.get("title", "?"), t["expr"]))
            walk(p.get("panels", []))

    walk(dashboard["panels"])
    return out


def query(url, expr):
    q = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=5) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"query failed: {body}")
    return body["data"]["result"]


def problem(url, expr):
    """None when the query has finite data, else what is wrong."""
    try:
        result = query(url, expr)
    except Exception as e:  # noqa: BLE001 - any failure is a failed check
        return f"error: {e}"
    if not result:
        return "no data"
    bad = [r for r in result if not math.isfinite(float(r["value"][1]))]
    if bad:
        return f"non-finite values: {[(r['metric'], r['value'][1]) for r in bad]}"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("consumer")
    ap.add_argument("--wait", type=float, default=30)
    ap.add_argument("--require", nargs="*", default=[])
    a = ap.parse_args()
    dash = json.loads(DASHBOARD.read_text())
    checks = [
        (title, expr.replace("$__rate_interval", "1m").replace("$consumer", a.consumer))
        for title, expr in queries(dash)
    ]
    checks += [(f"required series {m}", f'{m}{{consumer="{a.consumer}"}}') for m in a.require]
    if len(checks) < 2:
        sys.exit("check_dashboard: the dashboard has no queries")
    deadline = time.monotonic() + a.wait
    while True:
        failures = [(t, e, p) for t, e in checks if (p := problem(a.url, e))]
        if not failures or time.monotonic() > deadline:
            break
        time.sleep(1)
    for t, e, p in failures:
        print(f"check_dashboard: FAILED: panel {t!r}: {p}\n    {e}", file=sys.stderr)
    if failures:
        sys.exit(1)
    print(f"check_dashboard: {len(checks)} queries have data", file=sys.stderr)


if __name__ == "__main__":
    main()
