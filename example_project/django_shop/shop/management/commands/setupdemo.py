"""``python manage.py setupdemo``: ``migrate``, then an admin user for the demo.

``migrate`` makes the shop's tables and celery_agboss's store in the one database.
The admin user is ``admin`` with the password ``admin`` (``DJANGO_SHOP_ADMIN_PASSWORD``
sets another): for a demo on 127.0.0.1 only. Running it again changes nothing.
"""

from __future__ import annotations

import os
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand

ADMIN_USER = "admin"


class Command(BaseCommand):
    help = "Migrate the database and create the demo's admin user (admin / admin)."

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", interactive=False, verbosity=options["verbosity"])
        users = get_user_model().objects
        if users.filter(username=ADMIN_USER).exists():
            self.stdout.write(f"The admin user {ADMIN_USER!r} exists already.")
            return
        chosen = os.environ.get("DJANGO_SHOP_ADMIN_PASSWORD")
        users.create_superuser(ADMIN_USER, email="", password=chosen or "admin")
        said = "DJANGO_SHOP_ADMIN_PASSWORD's" if chosen else "'admin'"
        self.stdout.write(f"Created the admin user {ADMIN_USER!r}, password {said}.")
