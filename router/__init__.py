"""PromptEdge router package."""
