"""A deterministic Couchbase bucket simulator that writes DCP captures and their ground truth."""

from dcp_cdc.simulator.scenarios import SimulationResult, simulate
from dcp_cdc.simulator.state import SCENARIOS, SimConfig

__all__ = ["SCENARIOS", "SimConfig", "SimulationResult", "simulate"]
