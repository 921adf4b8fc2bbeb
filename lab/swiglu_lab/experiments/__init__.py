"""Kernels that a probe in lab/probes tried and the library does not ship: kept importable (and
their compiles tested) so the probe still runs. Nothing in the library or the bench imports them."""
