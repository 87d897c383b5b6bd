"""PS1–PS23 on the example shop: ``python -m example_project.scenarios [ps1 …] [--unprotected]``."""
