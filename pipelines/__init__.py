"""Spark jobs of dcp-cdc: pure DataFrame transforms per layer, and job modules that do the I/O.

Sessions are built in one place only, :mod:`pipelines.lake.spark_session`.
"""
