"""Credentials a location setting carries, kept out of logs and responses.

A model setting is a path or a hub name, but it may be a URL with ``user:password@`` or a
query such as ``?token=...``; the error messages of the code and of the libraries that load it
quote it verbatim, and the router shows those on unauthenticated routes (/health,
/cache/stats). :func:`shown_location` gives the form to show; :func:`hide_in_logs` registers
the secret parts so that every log line of the process masks them wherever a library writes
them; :func:`masked` applies the registry to any text. Exact substrings, not patterns: a
pattern both misses secrets (a password with an ``@``, ``sig=``, ``accessToken=``) and masks
what is not one (a request id ``sk-...``, ``hf_hub_download`` in a traceback)."""

from __future__ import annotations

import threading
from urllib.parse import urlsplit

MASK = "***"
_MIN_SECRET = 4  # shorter parts are not registered: masking "ab" would garble every line
_hidden: dict[str, str] = {}  # secret part -> what is written instead
_lock = threading.Lock()


def _parts(value: str) -> tuple[str | None, str | None]:
    """(user information, query) of ``value``: the text before the authority's last ``@`` of a
    ``scheme://`` URL, and everything after the first ``?``; None where absent."""
    userinfo = None
    if "://" in value:
        try:
            netloc = urlsplit(value).netloc
        except ValueError:
            netloc = value.split("://", 1)[1].split("/", 1)[0]
        if "@" in netloc:
            userinfo = netloc.rsplit("@", 1)[0]
    _, sep, query = value.partition("?")
    return userinfo, (query if sep and query else None)


def shown_location(value: str) -> str:
    """``value`` (a path, hub name or URL) as logs and responses show it: user information
    (up to the authority's last ``@``) becomes ``***@`` and the whole query ``?***``; a value
    with neither comes back unchanged. ``"https://u:p@ss@h/m?sig=x"`` -> ``"https://***@h/m?***"``."""
    userinfo, query = _parts(value)
    shown = value
    if query is not None:
        shown = shown[: shown.index("?")] + "?" + MASK
    if userinfo is not None:
        shown = shown.replace(userinfo + "@", MASK + "@", 1)
    return shown


def hide_in_logs(value: str) -> str:
    """Register ``value``'s secret parts (its user information and query, each of 4 characters
    or more) so that :func:`masked`, and with it every opskit log formatter of this process,
    writes ``***`` for them from now on. Returns :func:`shown_location` of ``value``. Idempotent;
    thread-safe; a value without such parts registers nothing."""
    userinfo, query = _parts(value)
    with _lock:
        for part in (userinfo, query):
            if part is not None and len(part) >= _MIN_SECRET:
                _hidden[part] = MASK
    return shown_location(value)


def masked(text: str) -> str:
    """``text`` with every registered secret part replaced by ``***`` (longest first, so a
    secret that contains another is masked whole). Costs nothing while none is registered."""
    if not _hidden:
        return text
    for secret in sorted(_hidden, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, _hidden[secret])
    return text


def forget_hidden() -> None:
    """Empty the registry (tests)."""
    with _lock:
        _hidden.clear()
