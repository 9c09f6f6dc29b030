"""`python -m study` (what `make compare` runs): the comparison, from the repository's root."""

from .cli import cli

cli()
