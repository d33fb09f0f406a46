"""Orchestration shared by every system: configs, run lifecycle, meters, records, tracking."""
