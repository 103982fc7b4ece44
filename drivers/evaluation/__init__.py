"""Evaluation: metrics, the SAFIM sandbox and the evaluate driver (never imported by the inference core)."""
