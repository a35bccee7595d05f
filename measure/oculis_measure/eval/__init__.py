"""Quality evals: per-tier accuracy against the all-strongest baseline, paired verdicts, the cascade on a
suite."""
