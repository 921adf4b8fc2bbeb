"""What the notebooks and the benchmark use, never a training job.

- ``analysis``: load recorded runs from ``data/``, derive tables (speed-ups, SOL fractions, history).
- ``plots``: every figure in ``figures/``.
- ``reproduce``: ``make reproduce`` (execute the notebooks with papermill, regenerate figures).
- ``gradient_validation``: the full-size gradient-validation experiment (notebook 02).
- ``tp_report``: the tensor-parallel report (notebook 05; the model is ``swiglu_lab.bench.tp_model``).
- ``train_step``: the training-step time and memory experiment (notebook 06).

These modules need the lab's notebooks extra (matplotlib, papermill); the library does not. They
may import ``swiglu_lab.bench``, never the reverse.
"""
