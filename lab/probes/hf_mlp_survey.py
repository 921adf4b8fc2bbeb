"""Which MLP classes of the installed transformers does the patch take, and does any carry the
kernel hub's decorator (a layer name ``kernelize`` could map)?

Answer (transformers 5.25, CPU venv): 147 classes whose ``forward`` is
``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` by ``swiglu.integrations.transformers.computes_swiglu``
(the syntax-tree check ``patch_classes`` uses), Llama, Mistral, Qwen2, Qwen3, OLMo, Granite and
Cohere among them; no MLP class is decorated with ``use_kernel_forward_from_hub``. Quoted in
docs/huggingface.md. No data file: it prints the count and the names.
Run: PYTHONPATH=src:lab python3 lab/probes/hf_mlp_survey.py   (~10 s, no GPU)
"""

import importlib
import inspect
import pkgutil
import re
import warnings
from pathlib import Path

import torch
import transformers
import transformers.models

from swiglu.integrations.transformers import computes_swiglu

warnings.filterwarnings("ignore")
found, hub = [], []
for info in pkgutil.iter_modules(transformers.models.__path__):
    folder = Path(transformers.models.__path__[0]) / info.name
    for path in sorted(folder.glob("modeling_*.py")):
        try:
            mod = importlib.import_module(f"transformers.models.{info.name}.{path.stem}")
        except Exception:  # noqa: BLE001 - a model whose optional dependency is missing
            continue
        source = path.read_text()
        for name, cls in vars(mod).items():
            if not (inspect.isclass(cls) and cls.__module__ == mod.__name__ and issubclass(cls, torch.nn.Module)):
                continue
            try:
                if computes_swiglu(cls):
                    found.append(name)
            except Exception:  # noqa: BLE001 - no source for a generated class
                pass
            if name.endswith("MLP") and re.search(rf"@use_kernel_forward_from_hub\([^)]*\)\s*class {name}\(", source):
                hub.append(name)
print(f"transformers {transformers.__version__}: {len(found)} classes compute the SwiGLU MLP")
print(", ".join(sorted(found)))
print(f"MLP classes with use_kernel_forward_from_hub: {len(hub)} {hub}")
