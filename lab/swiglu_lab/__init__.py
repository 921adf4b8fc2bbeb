"""The lab beside the ``swiglu`` library: what the notebooks, scripts and make targets use, never a
training job. Installed from ``lab/`` (``make venv``), not part of the ``swiglu`` wheel.

- ``bench``: the benchmark harness (``python -m swiglu_lab.bench``), GPU power, the peers.
- ``research``: analysis of recorded runs, figures, ``make reproduce``, docs tables, the TP report
  and the training-step experiment.
- ``paths``: where the repository is.

Imports go one way: the lab imports ``swiglu``, ``research`` may import ``bench``, ``bench`` never
imports ``research`` (``tests/repo/test_layout.py``).
"""
