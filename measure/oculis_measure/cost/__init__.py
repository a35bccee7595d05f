"""Dollars from the router's counters and the upstreams' prices: attribution by route, tier and upstream."""
