"""Forwarding one request: validate, look up the cache, rate-limit, send to a replica (upstream),
relay or read the answer, and store it."""
