"""Forwarding a request to a replica: the Forwarder (forwarder.py: admission, dispatch through the
Chooser, the upstream call, accounting) that every surface calls, the completion routes' own flow
(service.py: cache lookup, hits, misses stored through storing.py), the upstream transport."""
