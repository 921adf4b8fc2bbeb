"""Smoke test of the installed swiglu wheel, run by scripts/check_wheel.sh inside a venv that holds
only the wheel and the dependency closure of torch and triton (no extras).

Checks: swiglu comes from the venv (not src/), the research libraries are absent, the public API
works on the CPU (float64 against the float64 oracle / nn.Linear autograd), the kernels' config
tables shipped, and the HF integration imports without transformers and says how to get it.
Exits non-zero (an AssertionError or ImportError) on any failure.
"""

import importlib.resources
import importlib.util
import sys
import sysconfig

import torch

import swiglu
from swiglu.module import PlainSwiGLUMLP

site = sysconfig.get_paths()["purelib"]
assert swiglu.__file__.startswith(site), f"swiglu imported from {swiglu.__file__}, not the venv's {site}"
absent = ("pandas", "matplotlib", "tqdm", "pynvml", "papermill", "numpy", "transformers")
present = [m for m in absent if importlib.util.find_spec(m) is not None]
assert not present, f"the clean venv holds {present}: the check would prove nothing"

# The functional backward against the float64 oracle.
inputs = swiglu.make_inputs(2, 3, 16, 48, dtype=torch.float64, seed=0)
got = swiglu.swiglu_mlp_backward(*inputs.as_tuple(), impl="reference")
want = swiglu.float64_backward(*inputs.as_tuple())
for g, w in zip(got, want):
    torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)

# The module, forward and backward, against nn.Linear autograd.
torch.manual_seed(0)
plain = PlainSwiGLUMLP(16, 48, dtype=torch.float64)
ours = swiglu.SwiGLUMLP(16, 48, dtype=torch.float64)
ours.load_state_dict(plain.state_dict())
x = torch.randn(2, 5, 16, dtype=torch.float64)
for module in (ours, plain):
    module(x).square().sum().backward()
torch.testing.assert_close(ours(x), plain(x), rtol=1e-12, atol=1e-12)
for (name, p), q in zip(ours.named_parameters(), plain.parameters()):
    torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-12, msg=name)

tables = importlib.resources.files("swiglu.kernels")
assert all(tables.joinpath(f).is_file() for f in ("backward_configs.json", "forward_configs.json")), "config tables missing"
import swiglu.kernels.backward  # noqa: E402,F401 - imports triton: a required dependency

from swiglu.integrations import transformers as swiglu_hf  # noqa: E402

try:
    swiglu_hf.patch_classes()
except ImportError as exc:
    assert "swiglu[hf]" in str(exc), exc
else:
    raise AssertionError("patch_classes worked without transformers")
print(
    f"wheel smoke test passed: swiglu {swiglu.__version__} from {site}, torch {torch.__version__}, "
    f"python {sys.version.split()[0]}"
)
