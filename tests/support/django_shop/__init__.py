"""A Django project as the docs set one up (docs/django.md), for the Django tests.

Its database and broker come from the environment the test gives the process
(``AGBOSS_DJANGO_TEST``, JSON: ``database`` is one ``DATABASES`` entry, ``broker_url``,
``gateway_url``, ``queue``), so each test runs it on its own throwaway database.
Speed-ups (tests only): a 5 s lease, a 1 s retry delay, a 1 s outbox grace, no beat
(``agboss sweep --loop`` sweeps), ``-Q`` the test's queue. The tests run it through
tests/support/django_project.py and django_harness.py, never importing it themselves:
importing it makes this process a Django project.
"""

from tests.support.django_shop.celery import app as celery_app  # Celery's Django guide

__all__ = ["celery_app"]
