"""Workloads: datasets and request traces (read from paths; shared data is never copied here)."""
