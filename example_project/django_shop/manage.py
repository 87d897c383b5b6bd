#!/usr/bin/env python
"""Django's command-line utility for the example Django shop (``python manage.py …``).

Run it by its path from anywhere (``python example_project/django_shop/manage.py …``):
Python puts this folder first on ``sys.path``, so ``proj`` (the project) and ``shop``
(its app) import as they would in a project of your own.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
