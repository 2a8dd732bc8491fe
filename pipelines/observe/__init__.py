"""Observation of batch runs: their Prometheus metrics and silver's freshness."""
