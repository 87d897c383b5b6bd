"""The example Django shop's project package.

It imports the Celery app, as Celery's Django guide does, so that ``.delay()`` in a view
and ``manage.py agboss …`` use the app that carries ``AGBoss``.
"""

from .celery import app as celery_app

__all__ = ["celery_app"]
