"""A deterministic Couchbase bucket simulator that writes DCP captures and their ground truth."""

from dcp_cdc.simulator.scenarios import SCENARIOS, SimConfig, SimulationResult, simulate

__all__ = ["SCENARIOS", "SimConfig", "SimulationResult", "simulate"]
