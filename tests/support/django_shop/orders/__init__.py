"""The shop's own table: orders a fenced effect marks paid through the ORM."""
