"""The ``agboss`` management command."""
