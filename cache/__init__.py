"""PromptEdge cache package."""
