"""``python -m llds.dashboard``: the same as ``llds dashboard serve``."""

from llds.dashboard.cli import main

raise SystemExit(main())
