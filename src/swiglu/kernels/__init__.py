"""Every Triton kernel of the project, its launcher and its configuration table.

- ``tl_kernels``: the tl-level ``@triton.jit`` kernels (dSwiGLU GEMM, weight gradients, grad_x,
  the fused forward and the SwiGLU product).
- ``configs``: the configuration dataclasses, the token buckets and the backward's one table
  (``backward_configs.json``: tl and Gluon kernels, each entry with the time it measured).
- ``devices``: where the kernels run (the interpreter switch, supported devices, triton releases
  and sizes) and the persistent grid's size on a device.
- ``tma``: the host's TMA descriptors (``tma_ready``, ``Tma``, ``tma_descriptor``).
- ``launch``: the cached launch and direct C launcher, programmatic dependent launch (``set_pdl``)
  and the interpreter's lock.
- ``backward``: the backward launchers and ``triton_swiglu_backward``.
- ``gluon_wgrad``, ``gluon_dswiglu``: the warp-specialized Gluon kernels (sm_90, triton 3.6 and 3.7).
- ``forward``: the fused forward launcher; table ``forward_configs.json``.
- ``moe``: the routed experts' kernels (``swiglu.swiglu_moe``): grouped GEMMs over expert-sorted
  pairs, their routing tables and tiles (docs/moe.md); ``moe_gluon_up``, ``moe_gluon_dswiglu``,
  ``moe_gluon_wgrad_pingpong``: its warp-specialized Gluon forms of three of them (sm_90, the plan's
  choice; ``moe_gluon_wgrad``: the weight-gradient kernels' shared pieces).
- ``shared_memory``: the shared-memory estimate checked before a launch.

This package imports only torch, triton and ``swiglu.checks``; the library (``swiglu.api``,
``swiglu.ops``) imports it lazily, so ``import swiglu`` does not import Triton.
"""
