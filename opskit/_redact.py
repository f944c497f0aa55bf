"""Secrets out of free text: an error message that quotes a setting's value (a model path or
URL, a library's "not found" text around it) is shown by logs and by unauthenticated routes
(the router's /health and /cache/stats), so what looks like a credential is masked first."""

from __future__ import annotations

import re

# user information in any URL: scheme://user:password@host
_USERINFO = re.compile(r"(?<=://)[^/\s@]+@")
# name=value where the name is, or ends in, a credential word: token=, hf_token=, api-key=,
# password= (not prompt_tokens= or max_tokens=: the word must end the name)
_NAMED = re.compile(
    r"(?i)(?<![\w.-])((?:[\w.-]*[_.-])?"
    r"(?:token|secret|password|passwd|pwd|api[_-]?key|apikey|access[_-]?key|auth|authorization|credentials?|signature))"
    r"=([^&\s'\"]+)"
)
# tokens that announce themselves: Hugging Face (hf_), OpenAI-style (sk-), GitHub (ghp_ and kin), Slack (xox?-)
_PREFIXED = re.compile(r"(?<![\w-])(hf_|sk-|gh[pousr]_|xox[abpr]-)[A-Za-z0-9_-]{8,}")


def redact_text(text: str) -> str:
    """``text`` with URL user information replaced by ``***@``, the value of every
    ``name=value`` whose name is or ends in a credential word (token, secret, password, api_key,
    access_key, auth, authorization, credential, signature) by ``***``, and self-announcing
    tokens (``hf_...``, ``sk-...``, ``ghp_...``, ``xoxb-...``) by their prefix and ``***``.

    For text that may quote a setting (an error message, a library's log line), before a log
    or a response shows it. A pattern cannot know every secret: settings meant to hold one (API
    keys, Redis URLs) are never quoted, and this is the net under the ones that should not."""
    text = _USERINFO.sub("***@", text)
    text = _NAMED.sub(lambda m: f"{m.group(1)}=***", text)
    return _PREFIXED.sub(lambda m: f"{m.group(1)}***", text)
