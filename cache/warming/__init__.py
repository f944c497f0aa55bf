"""Predictive cache warming (issue 14 item 4): before a forecast peak, regenerate the expired
entries that were hot in the same time-of-day slot on earlier days. ``plan`` is the pure rule
set; ``popularity`` counts requests per slot in Redis; the router's warmer does the calls."""
