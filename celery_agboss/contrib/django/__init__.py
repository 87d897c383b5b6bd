"""celery_agboss in a Django project: add ``"celery_agboss.contrib.django"`` to
``INSTALLED_APPS`` (extra ``django``).

The store is then one of the project's databases (``agboss_django_database``, default
``"default"``; no ``agboss_database_url``), and ``python manage.py migrate`` makes and
upgrades its tables. docs/django.md says what is here, and what is not yet.
"""
