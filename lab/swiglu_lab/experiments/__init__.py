"""Kernels that a probe in lab/probes tried and the library does not ship: kept importable (and
their compiles tested) so the probe still runs. Nothing in the library or the bench imports them;
the probes, the scripts that build their inputs (scripts/table_variant.py, scripts/ncu_wgrad.py)
and the tests do. ``gluon_wgrad_resident``: the weight gradient with A held in shared memory,
which the library's backward runs for a table entry with ``GluonConfig.resident_k`` once imported.
``gluon_wgrad_probe``: the library's weight-gradient kernel with the probes' and tests' switches
(ablations, st.global stores, a slowed storer, the grad_x orientation), which the library's
backward runs for a table entry with ``GluonConfig.plain_store`` or a ``gluon_grad_x`` entry once
imported. ``candidates``: the library's Gluon kernels' candidate configurations that the probes
measure and the tests compile (a table entry's ``"candidate"`` index points into them).
``moe_persistent``: the six MoE kernels as persistent programs walking the tiles
(lab/probes/moe_persistent.py). ``moe_gluon_pairs``: the MoE down projection and grad_x as one
warp-specialized Gluon kernel over all experts (lab/probes/moe_gluon_pairs.py);
``moe_gluon_pairs_pingpong``, ``moe_gluon_dswiglu_pingpong``: those GEMMs and the dSwiGLU GEMM on
the weight gradients' ping-pong tile (lab/probes/moe_pingpong_ab.py).
``moe_gluon_up_gather``,
``moe_gluon_dswiglu_gather``: the MoE up projection and dSwiGLU GEMM gathering x's / grad_out's rows
with cp.async instead of reading a copy (lab/probes/moe_gluon_up.py, moe_gluon_dswiglu.py)."""
