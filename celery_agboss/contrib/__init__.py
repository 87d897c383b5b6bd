"""Integrations with the frameworks payment code is written in (``contrib.django``)."""
