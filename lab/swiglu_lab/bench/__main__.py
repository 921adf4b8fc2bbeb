"""``python -m swiglu.bench``: see ``swiglu.bench.cli``."""

from .cli import main

raise SystemExit(main())
