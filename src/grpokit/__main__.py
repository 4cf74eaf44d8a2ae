"""``python -m grpokit train ...``: the command line, as ``accelerate launch -m grpokit`` runs it."""

from grpokit.cli import main

raise SystemExit(main())
