"""Load tests: seeded workloads, per-request samples to metrics, SLO gates and baseline comparisons, the HTML report."""
