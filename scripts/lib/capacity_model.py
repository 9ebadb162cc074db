"""The capacity model of scripts/capacity (docs/capacity.md): pure arithmetic from measured
per-core figures to a deployment's size, and to what this machine should measure. No I/O, no
clock: tests/it/capacity_model.rs runs it (`scripts/capacity --model-only FILE`) on fixed figures.

Figures (`measured`, microseconds of CPU, whole processes):
  proxy_us          {"nolimit": µs, "redis": µs} of proxy CPU per request (one worker thread)
  redis_us          {"log": {"1": µs, "8": µs}, "slots": {...}} Redis CPU per decision by kind and
                    decisions per call (scripts/bench-script's cases 1-evict and s1-evict, paced)
  redis_us_proxied  Redis CPU per decision with proxies sending (their own calls and batches);
                    the sizing uses the larger of it and redis_us[kind][batch]
  bytes_per_client  {"redis_log": B, "redis_slots": B, "memory_store": B}
  machine_us        {"loadgen": µs, "upstream": µs} per request: what the rest of this machine
                    spends (only for predicting this machine's throughput)
"""

import math

# What the sizing assumes unless the figures' "assumptions" say otherwise (docs/capacity.md).
ASSUMPTIONS = {
    "targets": [10_000, 100_000, 1_000_000],  # requests per second
    "cpu_target": 0.5,        # each proxy core and Redis master sized to run at 50 % CPU
    "limited_share": 1.0,     # share of requests decided in Redis (1 decision each)
    "kind": "log",            # the limits' kind: "log" (exact) or "slots" (`resolution`)
    "batch": "1",             # decisions per call: a Cluster coalesces per hash slot, so 1
    "cores_per_proxy": 4,     # cores of one proxy instance (threads = 4)
    "min_proxies": 2,         # never fewer (one may be restarting)
    "clients_per_rps": 6,     # tracked clients per request/s: each sends 10 in a 60 s window
    "memory_overhead": 1.5,   # Redis RSS over used_memory (fragmentation, buffers)
    "max_gb_per_master": 8,   # dataset a master should hold (failover and resync time)
    "replicas": 1,            # replicas per master (memory and cores, not decisions)
    "machine_cores": 2,       # this machine's cores, for what it should measure
}


class ModelError(ValueError):
    """A figure the model needs is missing or not a positive number."""


def _num(tree, *path):
    node = tree
    for p in path:
        if not isinstance(node, dict) or p not in node:
            raise ModelError(f"missing figure {'.'.join(path)}")
        node = node[p]
    if isinstance(node, bool) or not isinstance(node, (int, float)) or node <= 0:
        raise ModelError(f"figure {'.'.join(path)} must be a positive number, not {node!r}")
    return float(node)


def assumptions(measured):
    out = dict(ASSUMPTIONS)
    given = measured.get("assumptions", {})
    unknown = sorted(set(given) - set(ASSUMPTIONS))
    if unknown:
        raise ModelError(f"unknown assumption(s): {', '.join(unknown)}")
    out.update(given)
    if out["kind"] not in ("log", "slots"):
        raise ModelError(f"assumption kind must be log or slots, not {out['kind']!r}")
    out["batch"] = str(out["batch"])
    return out


def redis_us(measured, a):
    """Redis CPU per decision the sizing uses: the paced figure at the assumed kind and batch, or
    the proxied one where that is higher (more calls, fewer decisions per read). The proxied
    figure is the log kind's: for slots it is scaled by slots/log of the paced figures."""
    paced = _num(measured, "redis_us", a["kind"], a["batch"])
    if measured.get("redis_us_proxied") is None:
        return paced
    scale = paced / _num(measured, "redis_us", "log", a["batch"])
    return round(max(paced, _num(measured, "redis_us_proxied") * scale), 3)


def _up(x):
    """Round a count up, forgiving float noise (60.000000001 needs 60, not 61)."""
    return math.ceil(x - 1e-9)


def size(measured, rps):
    """What `rps` requests a second need: proxy cores and instances, Redis masters (CPU and memory),
    memory. Every count rounded up."""
    a = assumptions(measured)
    proxy_us = _num(measured, "proxy_us", "redis")
    proxy_cores = rps * proxy_us / 1e6 / a["cpu_target"]
    proxies = max(a["min_proxies"], _up(proxy_cores / a["cores_per_proxy"]))
    decisions = rps * a["limited_share"]
    r_us = redis_us(measured, a)
    per_master = 1e6 / r_us * a["cpu_target"]
    masters_cpu = _up(decisions * r_us / 1e6 / a["cpu_target"])
    clients = rps * a["clients_per_rps"]
    per_client = _num(measured, "bytes_per_client", f"redis_{a['kind']}")
    redis_bytes = clients * per_client * a["memory_overhead"]
    masters_mem = _up(redis_bytes / (a["max_gb_per_master"] * 2**30))
    masters = max(1, masters_cpu, masters_mem)
    return {
        "rps": rps,
        "proxy_cores": round(proxy_cores, 2),
        "proxies": proxies,
        "decisions_per_s": decisions,
        "decisions_per_master": round(per_master),
        "masters_cpu": masters_cpu,
        "masters_memory": masters_mem,
        "masters": masters,
        "redis_nodes": masters * (1 + a["replicas"]),
        "clients": clients,
        "redis_gb": round(redis_bytes / 2**30, 2),
        "redis_gb_per_master": round(redis_bytes / 2**30 / masters, 2),
        "memory_store_gb_per_proxy": round(
            clients * _num(measured, "bytes_per_client", "memory_store") / 2**30, 2),
    }


def hot_key_ceiling(measured, batch="8"):
    """Decisions a second one key can get: its hash slot lives on one master, one core, at 100 %
    (a busy client's decisions arrive together: `batch` per call)."""
    a = assumptions(measured)
    return round(1e6 / _num(measured, "redis_us", a["kind"], str(batch)))


def machine_rps(measured, cores, masters=1, redis_per_decision=None):
    """What this machine should serve when it is the limit: `cores` over the CPU every request
    costs (load generator, proxy, Redis, upstream), and what each of `masters` carries with keys
    spread over the slots. On one machine the masters share its cores, so adding one adds no
    capacity: the prediction is flat in `masters`; the Redis-bound ceiling is not."""
    a = assumptions(measured)
    r_us = redis_per_decision if redis_per_decision is not None else redis_us(measured, a)
    per_req = (_num(measured, "proxy_us", "redis") + r_us * a["limited_share"]
               + _num(measured, "machine_us", "loadgen") + _num(measured, "machine_us", "upstream"))
    rps = cores * 1e6 / per_req
    return {
        "rps": round(rps),
        "cpu_us_per_request": round(per_req, 1),
        "redis_cpu_per_master": round(rps * a["limited_share"] * r_us / 1e6 / masters, 3),
        "redis_bound_rps": round(masters * 1e6 / (r_us * a["limited_share"])),
    }


def model(measured):
    """Everything --model-only prints: the sizing for each target and the hot-key ceiling."""
    a = assumptions(measured)
    return {
        "assumptions": a,
        "redis_us_used": redis_us(measured, a),
        "sizing": [size(measured, rps) for rps in a["targets"]],
        "hot_key_decisions_per_s": hot_key_ceiling(measured),
        "machine": [dict(masters=n, **machine_rps(measured, a["machine_cores"], n))
                    for n in (1, 2, 3)],
    }
