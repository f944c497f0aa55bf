"""PromptEdge forecaster package."""
