"""Training: corpus, example builders, the trainer and the GPU runbook (never imported by the inference core)."""
