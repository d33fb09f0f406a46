"""Serving family (BEAM paper): vanilla, Window-DVFS and BEAM on a simulator or real vLLM."""
