#!/usr/bin/env python3
"""Helpers for scripts/bench: free ports, one record per wrk run, and the Markdown report.

    bench.py ports N                      N free loopback TCP ports, space separated
    bench.py record --runs FILE ...       append one run (wrk output + CPU + Redis stats)
    bench.py render TEMPLATE OUT K=V...   copy TEMPLATE to OUT, replacing every @K@ by V
    bench.py report --runs FILE --meta F  print the Markdown report
    bench.py h2load FILE                  h2load's summary as the WRKJSON line wrk-report.lua prints

Only the standard library is used.
"""

import argparse
import json
import re
import socket
import statistics
import sys

CASES = {
    "A": "nginx `proxy_pass`, upstream keepalive",
    "B": "nginx + `limit_req` (allowed path)",
    "C": "slidegate, route without limits",
    "D": "slidegate + memory store (allowed path)",
    "E": "slidegate + Redis store (allowed path)",
    "F": "slidegate + Redis store (denied flood)",
    "G": "slidegate, no limits + JSON access log (file)",
    "H": "slidegate, no limits, HTTP/2 over TLS (h2load)",
    "I": "slidegate, no limits, HTTP/1.1 over TLS (wrk)",
    "L": "nginx + Lua + Redis, the common ZSET script per request (allowed path)",
    "M": "minimal Pingora proxy (examples/minimal_proxy.rs)",
    "N": "slidegate, no limits, only `X-Forwarded-For`, no `X-Request-Id`",
}
REDIS_CASES = ("E", "F", "L")
SCRIPT_CMDS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro")


# ------------------------------------------------------------------------------------------
def cmd_ports(args):
    socks = []
    for _ in range(args.n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    print(" ".join(str(s.getsockname()[1]) for s in socks))
    for s in socks:
        s.close()


def cmd_render(args):
    with open(args.template) as f:
        text = f.read()
    for kv in args.values:
        k, v = kv.split("=", 1)
        text = text.replace(f"@{k}@", v)
    left = sorted(set(re.findall(r"@([A-Z_]+)@", text)))
    if left:
        sys.exit(f"bench.py render: {args.template}: no value for {', '.join(left)}")
    with open(args.out, "w") as f:
        f.write(text)


def parse_info(path):
    """Redis INFO text -> ({cmd: {calls, usec, failed_calls, rejected_calls}}, cpu seconds)."""
    cmds, cpu = {}, 0.0
    if not path:
        return cmds, None
    with open(path) as f:
        for line in f:
            line = line.strip()
            m = re.match(r"cmdstat_([^:]+):(.*)", line)
            if m:
                fields = dict(kv.split("=", 1) for kv in m.group(2).split(","))
                cmds[m.group(1)] = {
                    k: float(fields.get(k, 0))
                    for k in ("calls", "usec", "failed_calls", "rejected_calls")
                }
            elif line.startswith(("used_cpu_sys:", "used_cpu_user:")):
                cpu += float(line.split(":", 1)[1])
    return cmds, cpu


def cmd_h2load(args):
    """h2load has no latency percentiles: p50/p99 are left out (n/a), the mean is kept."""
    with open(args.file) as f:
        text = f.read()
    fin = re.search(r"finished in ([0-9.]+)(ms|s),", text)
    reqs = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
                     r"(\d+) failed, (\d+) errored, (\d+) timeout", text)
    codes = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", text)
    mean = re.search(r"time for request:\s+\S+\s+\S+\s+([0-9.]+)(us|ms|s)", text)
    traffic = re.search(r"traffic: .*?\((\d+)\) total", text)
    if not (fin and reqs and codes):
        sys.exit(f"bench.py h2load: unexpected output:\n{text}")
    secs = float(fin.group(1)) / (1000 if fin.group(2) == "ms" else 1)
    done = int(reqs.group(3))
    scale = {"us": 1, "ms": 1e3, "s": 1e6}
    rec = {
        "requests": done, "bytes": int(traffic.group(1)) if traffic else 0,
        "duration_us": int(secs * 1e6),
        "status_errors": sum(int(codes.group(i)) for i in (2, 3, 4)),
        "connect_errors": 0, "read_errors": int(reqs.group(6)), "write_errors": int(reqs.group(5)),
        "timeouts": int(reqs.group(7)),
        "p50_us": None, "p90_us": None, "p99_us": None, "max_us": None,
        "mean_us": float(mean.group(1)) * scale[mean.group(2)] if mean else None,
    }
    print("WRKJSON " + json.dumps(rec))


def cmd_record(args):
    wrk = None
    with open(args.wrk_file) as f:
        text = f.read()
    for line in text.splitlines():
        if line.startswith("WRKJSON "):
            wrk = json.loads(line[len("WRKJSON "):])
    if wrk is None:
        sys.exit(f"bench.py: no WRKJSON line in wrk output:\n{text}")
    rec = {"case": args.case, "round": args.round, **wrk}
    secs = wrk["duration_us"] / 1e6
    rec["rps"] = wrk["requests"] / secs if secs > 0 else 0.0
    reqs = max(wrk["requests"], 1)
    if args.cpu_before is not None and args.cpu_after is not None:
        rec["proxy_cpu_us_per_req"] = (args.cpu_after - args.cpu_before) / args.clk_tck * 1e6 / reqs
    if args.user_before is not None and args.user_after is not None:
        rec["proxy_user_us_per_req"] = (args.user_after - args.user_before) / args.clk_tck * 1e6 / reqs
    if args.redis_after:
        cmds, cpu_after = parse_info(args.redis_after)
        _, cpu_before = parse_info(args.redis_before)
        calls = sum(cmds.get(c, {}).get("calls", 0) for c in SCRIPT_CMDS)
        usec = sum(cmds.get(c, {}).get("usec", 0) for c in SCRIPT_CMDS)
        failed = sum(cmds.get(c, {}).get("failed_calls", 0) + cmds.get(c, {}).get("rejected_calls", 0)
                     for c in SCRIPT_CMDS)
        rec["redis_script_calls"] = calls
        rec["redis_script_failed"] = failed
        rec["redis_usec_per_call"] = usec / calls if calls else None
        # Calls decide batches of requests: the script's time per decision is per request.
        rec["redis_script_usec_per_req"] = usec / reqs
        rec["redis_calls_per_req"] = calls / reqs
        rec["redis_all_calls"] = sum(v["calls"] for v in cmds.values())
        if cpu_before is not None and cpu_after is not None:
            rec["redis_cpu_us_per_req"] = (cpu_after - cpu_before) * 1e6 / reqs
    with open(args.runs, "a") as f:
        f.write(json.dumps(rec) + "\n")
    extra = ""
    if "redis_calls_per_req" in rec:
        upc = rec["redis_usec_per_call"]
        extra = f"  redis {rec['redis_calls_per_req']:.3f} calls/req, " + (
            f"{upc:.2f} usec/call" if upc is not None else "no script calls")
    errs = wrk["connect_errors"] + wrk["read_errors"] + wrk["write_errors"] + wrk["timeouts"]
    print(f"  round {args.round} case {args.case}: {rec['rps']:>9.0f} req/s  "
          f"p50 {fmt_ms(wrk['p50_us'])}  p99 {fmt_ms(wrk['p99_us'])}  "
          f"non-2xx {wrk['status_errors']}  socket errors {errs}{extra}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------
def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt_rps(v):
    return "n/a" if v is None else f"{v:,.0f}"


def fmt_ms(us):
    return "n/a" if us is None else f"{us / 1000:.2f} ms"


def fmt_ratio(v):
    return "n/a" if v is None else f"{v:.2f}×"


def fmt_num(v, spec):
    return "n/a" if v is None else format(v, spec)


def paired_ratio(by_case, num, den):
    """Median over rounds of num/den, each ratio taken within one round (same conditions)."""
    if num not in by_case or den not in by_case:
        return None
    den_by_round = {r["round"]: r["rps"] for r in by_case[den]}
    ratios = [r["rps"] / den_by_round[r["round"]] for r in by_case[num]
              if den_by_round.get(r["round"])]
    return med(ratios)


def total_cpu(r):
    """Proxy plus Redis CPU per request of one run (None when either is missing)."""
    proxy, redis = r.get("proxy_cpu_us_per_req"), r.get("redis_cpu_us_per_req")
    return None if proxy is None or redis is None else proxy + redis


def paired_cpu_ratio(by_case, num, den):
    """Median over rounds of num's total CPU per request / den's, within one round."""
    if num not in by_case or den not in by_case:
        return None
    den_by_round = {r["round"]: total_cpu(r) for r in by_case[den]}
    ratios = [total_cpu(r) / den_by_round[r["round"]] for r in by_case[num]
              if total_cpu(r) is not None and den_by_round.get(r["round"])]
    return med(ratios)


def paired_diff(by_case, num, den, field):
    """Median over rounds of num[field] - den[field], each difference taken within one round."""
    if num not in by_case or den not in by_case:
        return None
    den_by_round = {r["round"]: r.get(field) for r in by_case[den]}
    diffs = [r[field] - den_by_round[r["round"]] for r in by_case[num]
             if r.get(field) is not None and den_by_round.get(r["round"]) is not None]
    return med(diffs)


def metric_total(path, name, label_filter=None):
    """Sum a Prometheus counter family from a /metrics dump, optionally filtered by labels."""
    total = 0.0
    try:
        with open(path) as f:
            for line in f:
                if not line.startswith(name):
                    continue
                m = re.match(r"(\w+)(\{[^}]*\})?\s+([0-9.eE+-]+)", line)
                if not m or m.group(1) != name:
                    continue
                labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
                if label_filter and any(labels.get(k) != v for k, v in label_filter.items()):
                    continue
                total += float(m.group(3))
    except OSError:
        return None
    return total


def cmd_report(args):
    with open(args.meta) as f:
        meta = json.load(f)
    runs = []
    with open(args.runs) as f:
        runs = [json.loads(line) for line in f if line.strip()]
    by_case = {}
    for r in runs:
        by_case.setdefault(r["case"], []).append(r)
    skipped = dict(kv.split("=", 1) for kv in args.skip)
    metrics_files = dict(kv.split("=", 1) for kv in args.metrics)

    out = []
    p = out.append
    p(f"### slidegate benchmark ({meta['date']})")
    p("")
    p(f"`{meta['command']}` — commit `{meta['commit']}`, {meta.get('build', 'release build')}, {meta['cpus']} CPUs ({meta['cpu_model']}), "
      f"{meta['rounds']} interleaved round{'s' if int(meta['rounds']) != 1 else ''} of `wrk -t{meta['wrk_threads']} -c{meta['connections']} "
      f"-d{meta['duration']}` per case on loopback, after a {meta['warmup']} warm-up per case. "
      f"slidegate `threads = {meta['sg_threads']}`; nginx `worker_processes {meta['sg_threads']}` "
      f"({meta['nginx_version']}); {meta['redis_version']}; wrk {meta['wrk_version']}.")
    p("")
    p("| case | median req/s | p50 | p99 | vs nginx proxy_pass | vs slidegate no-limit | proxy CPU µs/req | of it user |")
    p("|---|---:|---:|---:|---:|---:|---:|---:|")
    stats = {}
    for key, name in CASES.items():
        if key in skipped:
            p(f"| {key}. {name} | SKIPPED | | | | | | |")
            continue
        rs = by_case.get(key)
        if not rs:
            continue
        s = {
            "rps": med(r["rps"] for r in rs),
            "p50": med(r["p50_us"] for r in rs),
            "p99": med(r["p99_us"] for r in rs),
            "cpu": med(r.get("proxy_cpu_us_per_req") for r in rs),
            "user": med(r.get("proxy_user_us_per_req") for r in rs),
            "vs_a": paired_ratio(by_case, key, "A"),
            "vs_c": paired_ratio(by_case, key, "C"),
            "usec_per_call": med(r.get("redis_usec_per_call") for r in rs),
            "usec_per_req": med(r.get("redis_script_usec_per_req") for r in rs),
            "calls_per_req": med(r.get("redis_calls_per_req") for r in rs),
            "redis_cpu": med(r.get("redis_cpu_us_per_req") for r in rs),
            "non2xx": sum(r["status_errors"] for r in rs),
            "requests": sum(r["requests"] for r in rs),
            "sock_errors": sum(r["connect_errors"] + r["read_errors"] + r["write_errors"] + r["timeouts"]
                               for r in rs),
            "script_failed": sum(r.get("redis_script_failed") or 0 for r in rs),
        }
        stats[key] = s
        p(f"| {key}. {name} | {fmt_rps(s['rps'])} | {fmt_ms(s['p50'])} | {fmt_ms(s['p99'])} | "
          f"{fmt_ratio(s['vs_a'])} | {fmt_ratio(s['vs_c'])} | {fmt_num(s['cpu'], '.1f')} | "
          f"{fmt_num(s['user'], '.1f')} |")
    p("")

    redis_rows = [k for k in REDIS_CASES if k in stats]
    if redis_rows:
        p("| Redis case | EVALSHA usec_per_call | script calls / request | script µs / request "
          "(per decision) | Redis CPU µs/request |")
        p("|---|---:|---:|---:|---:|")
        for k in redis_rows:
            s = stats[k]
            p(f"| {k}. {CASES[k]} | {fmt_num(s['usec_per_call'], '.2f')} | "
              f"{fmt_num(s['calls_per_req'], '.4f')} | {fmt_num(s['usec_per_req'], '.2f')} | "
              f"{fmt_num(s['redis_cpu'], '.1f')} |")
        p("")
    for k, reason in sorted(skipped.items()):
        p(f"SKIPPED {k}. {CASES[k]}: {reason}")
    if skipped:
        p("")

    # Targets.
    p("Targets:")
    p("")
    targets = []

    def target(label, value_text, ok):
        verdict = "SKIPPED" if ok is None else ("PASS" if ok else "FAIL")
        targets.append(verdict)
        p(f"- {verdict}: {label} — {value_text}")

    def have(*keys):
        return all(k in stats for k in keys)

    e, f = stats.get("E"), stats.get("F")
    if have("E", "C") and e["vs_c"] is not None:
        target("Redis allowed path ≥ 0.95× slidegate no-limit route", f"{e['vs_c']:.3f}×", e["vs_c"] >= 0.95)
    else:
        target("Redis allowed path ≥ 0.95× slidegate no-limit route", "not measured", None)
    if have("E", "A") and e["vs_a"] is not None:
        target("Redis allowed path ≥ 0.6× nginx proxy_pass", f"{e['vs_a']:.3f}×", e["vs_a"] >= 0.6)
    else:
        target("Redis allowed path ≥ 0.6× nginx proxy_pass", "not measured", None)
    el = paired_ratio(by_case, "E", "L") if have("E", "L") else None
    el_cpu = paired_cpu_ratio(by_case, "E", "L") if have("E", "L") else None
    # Issue 34's bars, at equal workers (slidegate `threads` = nginx `worker_processes`).
    w = f"{meta['sg_threads']} worker{'s' if int(meta['sg_threads']) != 1 else ''} each"
    target(f"Redis route ≥ 1.1× nginx + Lua + Redis, {w} (E / L req/s)",
           "not measured" if el is None else f"{el:.3f}×", None if el is None else el >= 1.1)
    target(f"proxy + Redis CPU per allowed request ≤ 0.85× nginx + Lua + Redis, {w} (E / L)",
           "not measured" if el_cpu is None else f"{el_cpu:.3f}×",
           None if el_cpu is None else el_cpu <= 0.85)
    target("Redis allowed path ≥ 1.3× nginx + Lua + Redis (E / L req/s)",
           "not measured" if el is None else f"{el:.3f}×", None if el is None else el >= 1.3)
    target("proxy + Redis CPU per allowed request ≤ 0.6× nginx + Lua + Redis (E / L)",
           "not measured" if el_cpu is None else f"{el_cpu:.3f}×",
           None if el_cpu is None else el_cpu <= 0.6)
    fe = paired_ratio(by_case, "F", "E") if have("E", "F") else None
    if fe is not None:
        target("denied flood ≥ 1.5× Redis allowed path", f"{fe:.3f}×", fe >= 1.5)
    else:
        target("denied flood ≥ 1.5× Redis allowed path", "not measured", None)
    if f is not None and f["calls_per_req"] is not None:
        target("≤ 0.01 Redis calls per denied request", f"{f['calls_per_req']:.4f}", f["calls_per_req"] <= 0.01)
    else:
        target("≤ 0.01 Redis calls per denied request", "not measured", None)
    log_cost = paired_diff(by_case, "G", "C", "proxy_cpu_us_per_req")
    if log_cost is not None:
        target("JSON access log ≤ 1.5 µs proxy CPU per request (G − C)", f"{log_cost:.2f} µs",
               log_cost <= 1.5)
    else:
        target("JSON access log ≤ 1.5 µs proxy CPU per request (G − C)", "not measured", None)
    cm = paired_ratio(by_case, "C", "M") if have("C", "M") else None
    # Issue 57's bar (issue 34's was 0.95×).
    target("slidegate no-limit route ≥ 1.05× minimal Pingora proxy (C / M req/s)",
           "not measured" if cm is None else f"{cm:.3f}×", None if cm is None else cm >= 1.05)
    nm = paired_ratio(by_case, "N", "M") if have("N", "M") else None
    if nm is not None:
        target("no-limit route with only X-Forwarded-For and no X-Request-Id ≥ 0.95× minimal "
               "Pingora proxy (N / M req/s)", f"{nm:.3f}×", nm >= 0.95)
    for case, label, limit in (("D", "memory-store route", 1.0), ("E", "Redis-store route", 2.0)):
        d = paired_diff(by_case, case, "C", "proxy_cpu_us_per_req")
        target(f"{label}: proxy CPU ≤ {limit} µs per request over the no-limit route ({case} − C)",
               "not measured" if d is None else f"{d:+.2f} µs", None if d is None else d <= limit)
    e_upd = stats["E"]["usec_per_req"] if "E" in stats else None
    target("Redis script µs per decision ≤ 5, one limit, steady state with eviction (E; "
           "usec of EVALSHA / requests, as calls decide batches)",
           "not measured" if e_upd is None else f"{e_upd:.2f}", None if e_upd is None else e_upd <= 5)
    l_upd = stats["L"]["usec_per_req"] if "L" in stats else None
    el_script = e_upd / l_upd if e_upd is not None and l_upd else None
    target("Redis script CPU per decision ≤ 0.4× the common ZSET script on the same Redis "
           "(E / L, script µs per decision)",
           "not measured" if el_script is None else f"{el_script:.3f}×",
           None if el_script is None else el_script <= 0.4)
    p("")

    # Sanity checks: a benchmark of errors is no benchmark.
    warnings = []
    for k, s in stats.items():
        if s["sock_errors"]:
            warnings.append(f"case {k}: {s['sock_errors']} wrk socket errors")
        if k == "L" and s["calls_per_req"] is not None and abs(s["calls_per_req"] - 1) > 0.01:
            warnings.append(f"case L: {s['calls_per_req']:.3f} script calls per request (1 expected)")
        if k != "F" and s["non2xx"]:
            warnings.append(f"case {k}: {s['non2xx']} non-2xx responses on an allowed path")
        if k == "F" and s["non2xx"] < 0.999 * s["requests"]:
            warnings.append(f"case F: only {s['non2xx']} of {s['requests']} responses were non-2xx")
        if s["script_failed"]:
            warnings.append(f"case {k}: {s['script_failed']:.0f} failed/rejected Redis script calls")
    # Calls decide batches, so fewer calls than requests is expected; more is not.
    if "E" in stats and stats["E"]["calls_per_req"] is not None and stats["E"]["calls_per_req"] > 1.01:
        warnings.append(f"case E: {stats['E']['calls_per_req']:.3f} Redis script calls per "
                        f"request on the allowed path (at most 1 expected)")
    for name, path in metrics_files.items():
        errs = metric_total(path, "slidegate_store_errors_total")
        if errs:
            warnings.append(f"slidegate {name}: slidegate_store_errors_total = {errs:.0f}")
        dropped = metric_total(path, "slidegate_access_log_dropped_total")
        if dropped:
            warnings.append(f"slidegate {name}: {dropped:.0f} access log lines dropped")
        for d in ("error_allowed", "error_denied"):
            n = metric_total(path, "slidegate_requests_total", {"decision": d})
            if n:
                warnings.append(f"slidegate {name}: {n:.0f} requests decided `{d}`")
    if warnings:
        p("Warnings (these numbers are suspect):")
        p("")
        for w in warnings:
            p(f"- WARNING: {w}")
        p("")

    p("Notes: req/s, p50, p99 and CPU are medians over rounds; each ratio is the median of the "
      "per-round ratios (cases of one round run back to back). p50/p99 are wrk's latency "
      "percentiles. proxy CPU µs/req = user+sys CPU of the proxy process(es) (nginx master + "
      "worker) / requests; 'of it user' is the user-space part (the kernel's socket work excluded). Redis usec_per_call is `INFO commandstats` for EVALSHA/EVAL "
      "(reset with `CONFIG RESETSTAT` right before each Redis run); calls/request = those calls "
      "/ requests wrk completed (below 1: one call decided a batch of requests); script µs / "
      "request = their usec / requests; Redis CPU = `used_cpu_user+sys` delta / requests. "
      "nginx `limit_req`: `rate=100000000r/s burst=100000 nodelay`, keyed by `$binary_remote_addr` "
      "(never rejects or delays). nginx + Lua + Redis (L): `access_by_lua_block` with "
      "lua-resty-redis (keepalive pool of 64), the common ZSET script (ZREMRANGEBYSCORE, ZCARD, "
      "ZADD with a unique member, EXPIRE, ZRANGE) by EVALSHA per request, `ngx.now()` as the clock, "
      "1 000 000 000 per 1 s keyed by the client address, the same Redis as E; its proxy CPU is "
      "the nginx master + worker. slidegate allowed paths: key `client_ip`, "
      "`{ requests = 1000000000, window = \"1s\" }` (never reached); denied flood: "
      "`{ requests = 1, window = \"1h\" }`, primed before each round so every measured request is a 429; "
      "Redis routes use `on_error = \"deny\"` (a store failure would show as a non-2xx, never as a "
      "fast fail-open), other `[store]` keys at their defaults. "
      "One wrk client, so one bucket; upstream: a separate nginx (`worker_processes 1`) answering "
      "`return 200 \"ok\"`. G writes one JSON line per request to a file in the bench's temp dir; "
      "its cost is the median per-round difference of proxy CPU µs/request between G and C. "
      "H and I use a throwaway ECDSA P-256 certificate (TLS 1.3, rustls); H runs h2load "
      "(`-m1`: one stream in flight per connection, like wrk's one request per connection), "
      "which reports no latency percentiles. All on one 2-CPU machine, so load generator, proxy, upstream and Redis "
      "share the CPUs: compare ratios, not absolute numbers.")
    text = "\n".join(out) + "\n"
    sys.stdout.write(text)
    if args.md:
        with open(args.md, "w") as fh:
            fh.write(text)
    if args.strict and "FAIL" in targets:
        sys.exit(3)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("ports")
    a.add_argument("n", type=int)
    a.set_defaults(func=cmd_ports)
    a = sub.add_parser("render")
    a.add_argument("template")
    a.add_argument("out")
    a.add_argument("values", nargs="*")
    a.set_defaults(func=cmd_render)
    a = sub.add_parser("record")
    a.add_argument("--runs", required=True)
    a.add_argument("--case", required=True)
    a.add_argument("--round", type=int, required=True)
    a.add_argument("--wrk-file", required=True)
    a.add_argument("--cpu-before", type=float)
    a.add_argument("--cpu-after", type=float)
    a.add_argument("--user-before", type=float)
    a.add_argument("--user-after", type=float)
    a.add_argument("--clk-tck", type=float, default=100.0)
    a.add_argument("--redis-before")
    a.add_argument("--redis-after")
    a.set_defaults(func=cmd_record)
    a = sub.add_parser("h2load")
    a.add_argument("file")
    a.set_defaults(func=cmd_h2load)
    a = sub.add_parser("report")
    a.add_argument("--runs", required=True)
    a.add_argument("--meta", required=True)
    a.add_argument("--md")
    a.add_argument("--strict", action="store_true")
    a.add_argument("--skip", action="append", default=[], help="CASE=reason")
    a.add_argument("--metrics", action="append", default=[], help="name=path of a /metrics dump")
    a.set_defaults(func=cmd_report)
    args = ap.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
