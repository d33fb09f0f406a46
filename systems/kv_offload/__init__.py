"""Test-time-compute (TTC) engine: step-wise beam search with an offloaded KV cache (LBS paper)."""
