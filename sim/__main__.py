"""``python -m sim``: the simulator's command line (see ``python -m sim --help``)."""

from sim.cli import app

app(prog_name="python -m sim")
