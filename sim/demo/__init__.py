"""The local demo (``python -m sim demo``, ``make demo``): Redis, three simulated replicas and the
router as processes, a trace replay through the router, then the forecaster on what it counted.

- ``run``: starts, replays, forecasts and stops (:func:`run_demo`);
- ``report``: the report in text (the replay table, then the forecaster section);
- ``plot``: the report's picture.
"""

from sim.demo.report import render
from sim.demo.run import DemoConfig, run_demo

__all__ = ["DemoConfig", "render", "run_demo"]
