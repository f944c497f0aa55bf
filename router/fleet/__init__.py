"""The fleet of replicas: their runtime state, health (probes, circuit breaker) and the scraper that
reads their load signals. Scoring lives in router.dispatch, membership in router.discovery."""
