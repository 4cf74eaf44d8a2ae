"""``python -m grpokit.cli train ...`` (what ``accelerate launch`` and ``torchrun`` run)."""

from grpokit.cli import main

raise SystemExit(main())
