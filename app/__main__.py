"""``python -m app``: same as the ``gateway`` console script."""

from app.cli import main

raise SystemExit(main())
