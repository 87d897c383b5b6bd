"""A Django project as the docs set one up (docs/django.md), for the Django tests.

Its database and broker come from the environment the test gives the process
(``AGBOSS_DJANGO_TEST``, JSON: ``database`` is one ``DATABASES`` entry, ``broker_url``,
``gateway_url``, ``queue``), so each test runs it on its own throwaway database.
Speed-ups (tests only): a 5 s lease, a 1 s retry delay, no beat, ``-Q`` the test's queue.
"""
