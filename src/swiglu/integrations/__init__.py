"""Integrations of the SwiGLU MLP op with model libraries (Liger-style: the ops and their autograd
live in ``swiglu.ops``; the code that patches other libraries' models lives here).

* ``swiglu.integrations.transformers``: Hugging Face transformers' Llama-family MLPs
  (``apply(model)`` after loading, ``patch_classes()`` before ``from_pretrained``).

Nothing is imported here: each integration imports its library only when used.
"""
