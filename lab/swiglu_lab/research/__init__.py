"""What the notebooks and the benchmark use, never a training job.

- ``analysis``: load recorded runs from ``data/``, derive tables (speed-ups, SOL fractions, history).
- ``plots``: every figure in ``figures/``.
- ``reproduce``: ``make reproduce`` (execute the notebooks with papermill, regenerate figures).
- ``gradient_validation``: the full-size gradient-validation experiment (notebook 02).
- ``tp_model``, ``tp_report``: the tensor-parallel time model and its report (notebook 05).
- ``train_step``: the training-step time and memory experiment (notebook 06).

These modules need the research extras (pandas, matplotlib, tqdm, papermill); the library does not.
"""
