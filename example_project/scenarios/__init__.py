"""The scenarios (design: scenarios) on the example shop:
``python -m example_project.scenarios [ps1 …] [--unprotected]``."""
