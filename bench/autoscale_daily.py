"""A replayed daily traffic curve through the autoscaler's pure core, in virtual time: GPU-hours used
with spec.autoscaling (and scale to zero with coldStart: escalate) against a fixed fleet sized for the
peak, and the requests that waited or failed.

    .venv/bin/python bench/autoscale_daily.py [--seed 1] [--cold-start-s 120] [--json]

The engine is a fluid model of vLLM continuous batching, not the simulator's token-level replay (a
day of it would take hours): each replica runs up to `--concurrency` sequences, each taking
`--service-s`; a request that finds no free slot waits in the queue (vllm:num_requests_waiting) and
fails after `--timeout-s`. The autoscaler sees exactly what Prometheus would give it every
`--eval-s` (waiting, running, KV usage as the share of busy slots, the router's demand over 60 s) and
new replicas serve only after `--cold-start-s` (a GPU pod's image pull, weights load and CUDA graphs),
holding their GPUs meanwhile. At zero, coldStart: escalate sends the request to the next tier.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import sys
from dataclasses import dataclass, field

import numpy as np

from oculis_operator import autoscale

# Requests per second at each hour of the day (UTC), a business-hours chat product: near nothing at
# night, a morning ramp, a lunch dip, an afternoon peak and an evening tail.
HOURLY = [0.0, 0.0, 0.0, 0.0, 0.0, 0.05, 0.4, 2, 6, 10, 12, 11, 8, 11, 14, 13, 10, 7, 4, 2.5, 1.5, 0.8, 0.3, 0.05]
DAY = 86_400
# A launch or a batch job: three times the peak for ten minutes at 10:30, faster than any cold start.
BURST = (10.5 * 3600, 600, 42.0)


@dataclass
class Result:
    name: str
    gpu_hours: float = 0.0
    requests: int = 0
    waited: int = 0  # queued more than 1 s before a slot took them
    failed: int = 0  # queued past the timeout
    escalated: int = 0  # answered by the next tier while the upstream was at zero
    max_replicas: int = 0
    scale_events: int = 0
    wait_seconds: list[float] = field(default_factory=list)


def rate_at(t: float) -> float:
    """Linear between the hourly points."""
    if BURST[0] <= t < BURST[0] + BURST[1]:
        return BURST[2]
    h = (t / 3600) % 24
    i = int(h)
    return HOURLY[i] + (HOURLY[(i + 1) % 24] - HOURLY[i]) * (h - i)


def run(args: argparse.Namespace, policy: autoscale.Policy | None, fixed: int, name: str) -> Result:
    rng = np.random.default_rng(args.seed)
    res = Result(name)
    ready = fixed if policy is None else max(1, policy.min_replicas)
    pending: list[float] = []  # ready_at of replicas starting
    running = 0.0
    queue: collections.deque[list[float]] = collections.deque()  # [arrival second, count]
    recent: collections.deque[int] = collections.deque(maxlen=60)  # arrivals of the last 60 s
    state = autoscale.State()
    for t in range(DAY):
        ready += sum(1 for r in pending if r <= t)
        pending = [r for r in pending if r > t]
        arrivals = int(rng.poisson(rate_at(t)))
        res.requests += arrivals
        recent.append(arrivals)
        if arrivals and ready == 0 and policy is not None and not pending:
            res.escalated += arrivals  # coldStart: escalate, nothing queued for a replica that is not coming
        elif arrivals and ready == 0 and policy is not None:
            res.escalated += arrivals  # still waking: the next tier answers meanwhile
        elif arrivals:
            queue.append([float(t), float(arrivals)])
        running -= running / args.service_s  # fluid completions
        free = ready * args.concurrency - running
        while queue and free >= 1:
            at, n = queue[0]
            take = min(n, math.floor(free))
            if t - at > 1:
                res.waited += int(take)
                res.wait_seconds.extend([t - at] * int(take))
            running += take
            free -= take
            if take == n:
                queue.popleft()
            else:
                queue[0][1] = n - take
        while queue and t - queue[0][0] > args.timeout_s:
            res.failed += int(queue.popleft()[1])
        current = ready + len(pending)
        res.gpu_hours += current * args.gpus_per_replica / 3600
        res.max_replicas = max(res.max_replicas, current)
        if policy is None or t % args.eval_s:
            continue
        waiting = sum(n for _, n in queue)
        sample = autoscale.Sample(pods=ready, waiting=waiting, running=running,
                                  kv_usage=running / (ready * args.concurrency) if ready else 0.0, newest_at=t)
        d = autoscale.decide(policy, current, ready, sample if ready else None, float(sum(recent)), state, t,
                             args.pool_replicas, pool="bench")
        state = d.state
        if d.desired > current:
            pending += [t + args.cold_start_s] * (d.desired - current)
            res.scale_events += 1
        elif d.desired < current:
            drop = current - d.desired
            keep = max(0, len(pending) - drop)  # starting replicas go first, then ready ones
            drop -= len(pending) - keep
            pending = pending[:keep]
            ready -= drop
            res.scale_events += 1
            if ready == 0:
                running = 0.0
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=32, help="sequences one replica runs at once")
    ap.add_argument("--service-s", type=float, default=4.0, help="seconds one request takes")
    ap.add_argument("--timeout-s", type=float, default=60.0, help="queued longer: failed")
    ap.add_argument("--cold-start-s", type=int, default=120, help="seconds before a new replica serves")
    ap.add_argument("--eval-s", type=int, default=15, help="autoscaler evaluation interval")
    ap.add_argument("--gpus-per-replica", type=int, default=1)
    ap.add_argument("--pool-replicas", type=int, default=16, help="replicas the GPU pool can hold")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    per_replica = args.concurrency / args.service_s  # requests per second one replica sustains
    peak = max(*HOURLY, BURST[2])
    fixed = math.ceil(peak / (per_replica * 0.8))  # peak at 80 % of the slots, the target below
    common = dict(max_replicas=args.pool_replicas, waiting_per_replica=5, kv_cache_usage=0.8,
                  scale_up_stabilization_s=30, scale_down_delay_s=300)
    runs = [
        run(args, None, fixed, f"fixed fleet for the peak ({fixed} replicas)"),
        run(args, autoscale.Policy(min_replicas=1, scale_to_zero_after_s=600, **common), 0, "autoscaled, min 1"),
        run(args, autoscale.Policy(min_replicas=0, scale_to_zero_after_s=600, **common), 0,
            "autoscaled, min 0 (coldStart: escalate)"),
    ]
    rows = [{"fleet": r.name, "gpu_hours": round(r.gpu_hours, 1), "requests": r.requests, "waited_over_1s": r.waited,
             "failed": r.failed, "escalated_at_zero": r.escalated, "max_replicas": r.max_replicas,
             "scale_events": r.scale_events,
             "p99_wait_s": round(float(np.percentile(r.wait_seconds, 99)), 1) if r.wait_seconds else 0.0}
            for r in runs]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"daily curve: peak {peak:g} req/s, {runs[0].requests} requests; replica = {args.concurrency} seqs x "
          f"{args.service_s:g} s ({per_replica:g} req/s), cold start {args.cold_start_s} s, seed {args.seed}")
    head = ["fleet", "gpu_hours", "requests", "waited_over_1s", "p99_wait_s", "failed", "escalated_at_zero",
            "max_replicas", "scale_events"]
    widths = [max(len(h), *(len(str(r[h])) for r in rows)) for h in head]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    for r in rows:
        print("  ".join(str(r[h]).ljust(w) for h, w in zip(head, widths, strict=True)))
    for a in runs[1:]:
        print(f"{a.name}: {100 * (1 - a.gpu_hours / runs[0].gpu_hours):.0f} % fewer GPU-hours than the fixed fleet, "
              f"{a.waited - runs[0].waited} more requests waited, {a.failed - runs[0].failed} more failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
