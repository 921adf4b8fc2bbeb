"""The README and docs/ as a user reads them: every ```python block runs as written (CPU, small
shapes) unless its first line marks it as a sketch (``# sketch: <why>``), and the install story
matches the Makefile and environment.yml."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SKETCH = "# sketch:"


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, code) of each ```python block."""
    return [
        (text[: m.start()].count("\n") + 2, m.group(1)) for m in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    ]


DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [(str(doc.relative_to(ROOT)), line, code) for doc in DOCUMENTS for line, code in python_blocks(doc.read_text())]
# A block repeated word for word (docs/usage.md repeats the README's training loop) runs once.
RUNNABLE = list({code: (name, line, code) for name, line, code in reversed(BLOCKS) if not code.startswith(SKETCH)}.values())[::-1]


def test_blocks_are_found_and_sketches_say_why():
    assert len([b for b in BLOCKS if b[0] == "README.md"]) >= 3 and len(RUNNABLE) >= 3
    assert {name for name, _, _ in RUNNABLE} >= {"README.md", "docs/usage.md"}
    for name, line, code in BLOCKS:
        if code.startswith(SKETCH):
            assert len(code.splitlines()[0]) > len(SKETCH) + 5, f"{name} line {line}: say why it is a sketch"


@pytest.mark.parametrize("name,line,code", RUNNABLE, ids=[f"{name}:{line}" for name, line, _ in RUNNABLE])
def test_documented_python_block_runs_as_written(name, line, code):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"{name}:{line}", "exec"), {"__name__": "__readme__"})
    assert out.getvalue().strip(), "a documented example should show its result"


def test_a_block_that_does_not_run_fails():
    code = "import swiglu\nswiglu.SwiGLUMLP(hidden_size, 2816)\n"  # an undefined name, as a stale example has
    with pytest.raises(NameError):
        exec(compile(code, "example", "exec"), {})


def _makefile_value(name: str, text: str) -> str:
    return re.search(rf"^{name} \?= (\S+)", text, flags=re.M).group(1)


def test_one_story_for_where_the_cpu_build_of_torch_comes_from():
    makefile = (ROOT / "Makefile").read_text()
    index = _makefile_value("TORCH_CPU_INDEX", makefile)
    torch_version = re.search(r"--index-url \$\(TORCH_CPU_INDEX\) torch==(\S+)", makefile).group(1)
    triton_version = re.search(r"pip install -q triton==(\S+)", makefile).group(1)
    pins = {name: _makefile_value(f"{name.upper()}_VERSION", makefile) for name in ("matplotlib", "numpy", "pandas")}
    env = (ROOT / "environment.yml").read_text()
    for line in (
        f"- --extra-index-url {index}",
        f"- torch=={torch_version}+cpu",
        f"- triton=={triton_version}",
        *(f"- {name}=={version}" for name, version in pins.items()),
    ):
        assert line in env, f"environment.yml lacks {line!r} (the Makefile's CPU install)"
    reproduce = (ROOT / "docs" / "reproduce.md").read_text()
    conda = reproduce[reproduce.index("## Conda") : reproduce.index("## Notebooks")]
    for text in (index, f"torch=={torch_version}+cpu", f"triton=={triton_version}"):
        assert text in conda, f"docs/reproduce.md's conda section lacks {text!r}"
    assert "environment.yml" in README[README.index("## Two commands") : README.index("## Using the package")]
    install = README[README.index("## Two commands") : README.index("Conda:")]
    for text in (index, f"torch=={torch_version}", f"triton=={triton_version}"):
        assert text in install, f"README's install section lacks {text!r}"


def test_the_hf_install_says_how_to_get_the_cpu_build_of_torch():
    """``pip install -e '.[hf]'`` alone pulls CUDA torch and its nvidia packages on a CPU-only
    machine: the README's Hugging Face section installs torch from the CPU index first."""
    section = README[README.index("## Use it in a Hugging Face training script") :]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1).splitlines()
    index = _makefile_value("TORCH_CPU_INDEX", (ROOT / "Makefile").read_text())
    hf = next(k for k, line in enumerate(block) if line.startswith("pip install -e '.[hf]'"))
    assert any(line.startswith(f"pip install torch --index-url {index}") for line in block[:hf]), block


def test_the_readme_is_a_front_page():
    """At most 10 KB: run logs and their stories live in docs/, one table per subject."""
    assert len(README.encode()) <= 10 * 1024, len(README.encode())
