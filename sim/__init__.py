"""PromptEdge sim package."""
