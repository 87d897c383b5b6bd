"""The framework-free core: keys, intents, leases, masking, history.

Nothing in this package imports Celery or SQLAlchemy (a test enforces it); the store
and the Celery layer adapt it.
"""
