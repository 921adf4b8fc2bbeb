"""Every Triton kernel of the project, its launcher and its configuration table.

- ``tl_kernels``: the tl-level ``@triton.jit`` kernels (dSwiGLU GEMM, weight gradients, grad_x,
  the fused forward and the SwiGLU product).
- ``common``: what the launchers share (``KernelConfig``, token buckets, TMA descriptors, the
  persistent grid size, supported devices and sizes).
- ``backward``: the backward launchers and ``triton_swiglu_backward``; table
  ``backward_configs.json``.
- ``forward``: the fused forward launcher; table ``forward_configs.json``.
- ``shared_memory``: the shared-memory estimate checked before a launch.

This package imports only torch, triton and ``swiglu.checks``; the library (``swiglu.api``,
``swiglu.ops``) imports it lazily, so ``import swiglu`` does not import Triton.
"""
