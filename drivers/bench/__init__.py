"""Benchmarks of the model, the open-checkpoint families and the remote server."""
