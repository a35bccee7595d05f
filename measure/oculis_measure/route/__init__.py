"""A route's tier split and cost: a scored sample, a window of counters, the cascade of escalation on the answer."""
