"""The router process: the uvicorn server with its connection limits, start-up (launch), the
resource limits and the frozen heap."""
