"""Triton's CPU interpreter without its per-call re-patching of ``triton.language``.

Under ``TRITON_INTERPRET=1`` every call of a ``@triton.jit`` helper from inside a kernel runs
``_patch_lang`` again: four ``inspect.getmembers`` sweeps over ``triton.language`` that find every
builtin already replaced by the kernel launch's own patching (a replaced builtin no longer carries
the builtin mark, so nothing new is patched). The kernels here call helpers inside their K loops, so
the sweeps were ~40% of an MoE interpreter test (``test_moe_kernels.py::test_against_float64``: 34 s
-> 21 s on a 2-core AVX2 machine). ``install()`` skips a helper's patching while a launch whose
patches already cover the helper's ``triton.language`` modules is running; launches patch and
restore as before, so what runs is unchanged. It also remembers ``_get_np_dtype``'s answer per
Triton dtype (the interpreter built an 18-entry dict on each of ~150,000 calls in that test; with
it, that test and the tile-order ones take 27-28.5 s against 37-38). Where Triton's interpreter
lacks ``_patch_lang`` or ``_get_np_dtype``, ``install()`` leaves it alone and returns False.
"""

from __future__ import annotations

import inspect

#: ``original``: the interpreter's own ``_patch_lang`` once wrapped; ``in_launch``: a launch's patches are
#: in place, covering the ``triton.language`` modules in ``langs``.
_STATE = {"original": None, "in_launch": False, "langs": set()}


class _NoChange:
    def restore(self) -> None:
        pass


def install() -> bool:
    """Wrap the interpreter's ``_patch_lang`` and ``_get_np_dtype`` (once); True where they are wrapped."""
    import triton.language as tl
    import triton.runtime.interpreter as interpreter

    if _STATE["original"] is not None:
        return True
    original = getattr(interpreter, "_patch_lang", None)
    np_dtype = getattr(interpreter, "_get_np_dtype", None)
    if original is None or np_dtype is None or list(inspect.signature(original).parameters) != ["fn"]:
        return False
    np_dtypes: dict = {}

    def get_np_dtype(tt_dtype):
        # A block's answer is its element type's; pointers (unhashable) are uint64 either way.
        scalar = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        if isinstance(scalar, tl.pointer_type):
            return np_dtype(scalar)
        found = np_dtypes.get(scalar)
        if found is None:
            found = np_dtypes[scalar] = np_dtype(scalar)
        return found

    langs_of: dict = {}

    def patch_lang(fn):
        langs = langs_of.get(fn)
        if langs is None:
            langs = langs_of[fn] = frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))
        if _STATE["in_launch"] and langs <= _STATE["langs"]:
            return _NoChange()  # a helper called inside a launch that has patched its modules
        scope = original(fn)
        _STATE["langs"] |= langs
        if not _STATE["in_launch"]:  # a launch (GridExecutor): restores its scope when the grid is done
            _STATE["in_launch"] = True
            restore = scope.restore

            def restore_and_forget():
                _STATE["in_launch"], _STATE["langs"] = False, set()
                restore()

            scope.restore = restore_and_forget
        return scope

    interpreter._patch_lang = patch_lang
    interpreter._get_np_dtype = get_np_dtype
    _STATE["original"] = original
    return True


#: ``python -c PRELUDE script args...`` runs ``script`` as ``python script args...`` does (its folder
#: first on sys.path, run as ``__main__``), with ``install()`` first; tests/ must be on PYTHONPATH.
PRELUDE = (
    "import os, runpy, sys, fast_interpreter; fast_interpreter.install(); sys.argv = sys.argv[1:]; "
    "sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0])); runpy.run_path(sys.argv[0], run_name='__main__')"
)
