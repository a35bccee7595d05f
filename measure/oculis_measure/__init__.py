"""The measurement library behind `oculis bench|eval|cost|cache|route analyze|status`: pure functions from
samples, counters and prices to figures and verdicts (plus the Prometheus client and the input readers
they need). The CLI's commands, the simulator and the benchmarks import it; it imports no command."""
