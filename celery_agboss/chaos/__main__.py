"""``python -m celery_agboss.chaos``: see the package docstring."""

from __future__ import annotations

from celery_agboss.chaos.run import main

raise SystemExit(main())
