"""Benchmarks (``make bench``); figures go to benchmarks/results/."""
