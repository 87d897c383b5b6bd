"""Benchmarks of celery_agboss against plain Celery (``make bench``; docs/benchmarks.md).

Speed and memory are measured here, as ratios against plain work measured in the
same run, never asserted in the test suite.
"""
