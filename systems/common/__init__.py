"""Machinery more than one system family uses: the GPU cost and power model, and LBS's group rules."""
