"""Render the same series and values as Ballast's /metrics with Python's prometheus_client.

Reads an exposition (written by `cargo bench -p ballast-engine --bench metrics_render`),
rebuilds every family as real prometheus_client Gauge/Counter/Histogram objects with the
same labels and values, then times generate_latest() on that registry.
"""

import sys
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families


def build(exposition: str) -> CollectorRegistry:
    registry = CollectorRegistry()
    for fam in text_string_to_metric_families(exposition):
        labelnames = sorted({k for s in fam.samples for k in s.labels if k != "le"})
        if fam.type == "gauge":
            g = Gauge(fam.name, fam.documentation, labelnames, registry=registry)
            for s in fam.samples:
                g.labels(**s.labels).set(s.value)
        elif fam.type == "counter":
            c = Counter(fam.name, fam.documentation, labelnames, registry=registry)
            for s in fam.samples:
                if s.name.endswith("_total"):
                    c.labels(**s.labels).inc(s.value)
        elif fam.type == "histogram":
            bounds = sorted({float(s.labels["le"]) for s in fam.samples if s.name.endswith("_bucket")} - {float("inf")})
            h = Histogram(fam.name, fam.documentation, labelnames, buckets=bounds, registry=registry)
            series = {}
            for s in fam.samples:
                key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                series.setdefault(key, {"buckets": {}, "sum": 0.0})
                if s.name.endswith("_bucket"):
                    series[key]["buckets"][float(s.labels["le"])] = s.value
                elif s.name.endswith("_sum"):
                    series[key]["sum"] = s.value
            for key, data in series.items():
                child = h.labels(**dict(key))
                previous = 0.0
                # prometheus_client keeps per-bucket counts and accumulates when rendering.
                for i, bound in enumerate(bounds + [float("inf")]):
                    cumulative = data["buckets"][bound]
                    child._buckets[i].set(cumulative - previous)
                    previous = cumulative
                child._sum.set(data["sum"])
        else:
            raise SystemExit(f"unexpected family type {fam.type} for {fam.name}")
    return registry


def main() -> None:
    exposition = open(sys.argv[1]).read()
    rust_us = float(sys.argv[2])
    registry = build(exposition)
    text = generate_latest(registry).decode()
    ours = sum(1 for line in exposition.splitlines() if line and not line.startswith("#"))
    # prometheus_client adds a _created sample per counter and histogram series; count ours only.
    theirs = sum(1 for line in text.splitlines() if line and not line.startswith("#") and "_created" not in line.split("{")[0])
    reps = 30
    start = time.perf_counter()
    for _ in range(reps):
        generate_latest(registry)
    py_us = (time.perf_counter() - start) / reps * 1e6
    print(f"python prometheus_client: {py_us:.1f} µs per render ({theirs} samples, ours {ours})")
    print(f"ballast is {py_us / rust_us:.1f}x faster (goal: at least 10x)")


if __name__ == "__main__":
    main()
