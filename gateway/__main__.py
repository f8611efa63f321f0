"""``python -m gateway``: same as the ``gateway`` console script."""

from gateway.cli import main

raise SystemExit(main())
