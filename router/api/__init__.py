"""The HTTP surface: OpenAI-compatible routes, the fast path for completions, operational routes,
request validation and the body-size guard."""
