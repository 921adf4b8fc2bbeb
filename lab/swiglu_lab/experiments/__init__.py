"""Kernels that a probe in lab/probes tried and the library does not ship: kept importable (and
their compiles tested) so the probe still runs. Nothing in the library or the bench imports them;
the probes, the scripts that build their inputs (scripts/table_variant.py, scripts/ncu_wgrad.py)
and the tests do. ``gluon_wgrad_resident``: the weight gradient with A held in shared memory,
which the library's backward runs for a table entry with ``GluonConfig.resident_k`` once imported.
``candidates``: the library's Gluon kernels' candidate configurations that the probes measure and
the tests compile (a table entry's ``"candidate"`` index points into them)."""
