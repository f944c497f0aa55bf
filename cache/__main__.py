"""``python -m cache``: inspect the response cache."""

from cache.cli import app

app(prog_name="python -m cache")
