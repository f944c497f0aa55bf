"""PromptEdge router: OpenAI-compatible edge router with exact cache and GPU-load-aware dispatch.

Public surface: :func:`create_app` (FastAPI app factory) and the settings types.
"""

from router.app import create_app
from router.settings import ReplicaSpec, RouterSettings

__all__ = ["ReplicaSpec", "RouterSettings", "create_app"]
