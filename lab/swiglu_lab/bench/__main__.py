"""``python -m swiglu_lab.bench``: see ``swiglu_lab.bench.cli``."""

from .cli import main

raise SystemExit(main())
