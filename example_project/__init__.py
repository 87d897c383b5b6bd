"""A small shop that charges through celery_agboss, and the scenarios that try to break it.

``example_project.shop`` is the Celery app a team would write (its tasks read like the
README's snippet); ``example_project.unprotected`` is the same shop written as plain
Celery, so each way to charge twice can be watched happening; ``example_project.scenarios``
runs the scenarios PS1–PS23 (design: scenarios) against both, on real worker processes
(``make demo``).
"""
