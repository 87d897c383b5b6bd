"""``python manage.py agboss …``."""
