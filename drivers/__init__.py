"""Drivers: evaluation, benchmark and training entry points. No serving module imports them."""
