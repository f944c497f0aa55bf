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

MASK = "***"
_MIN_SECRET = 6  # shorter parts are not registered: masking "token" would garble every access line
_hidden: dict[str, str] = {}  # secret part -> what is written instead
_lock = threading.Lock()


def _authority(value: str) -> str | None:
    """The authority (``[user[:password]@]host``) of ``value``: after ``scheme://`` or a
    leading ``//``, else the first path segment when it holds an ``@`` (``user:pw@host/m``,
    which a hub-name parser quotes back); None for a path or hub name."""
    if "://" in value:
        rest = value.split("://", 1)[1]
    elif value.startswith("//"):
        rest = value[2:]
    else:
        rest = value
        if "@" not in rest.split("/", 1)[0]:
            return None
    return rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]


def _parts(value: str) -> tuple[str | None, str | None, str | None]:
    """(user information, query, fragment) of ``value``: the authority's text before its last
    ``@``, what follows the first ``?`` (up to a ``#``), what follows the first ``#``; None
    where absent or empty."""
    authority = _authority(value)
    userinfo = authority.rsplit("@", 1)[0] if authority and "@" in authority else None
    before_fragment, hash_sep, fragment = value.partition("#")
    _, query_sep, query = before_fragment.partition("?")
    return userinfo or None, (query if query_sep and query else None), (fragment if hash_sep and fragment else None)


def shown_location(value: str) -> str:
    """``value`` (a path, hub name or URL) as logs and responses show it: user information
    (up to the authority's last ``@``) becomes ``***@``, the whole query ``?***`` and a fragment
    ``#***``; a value with none comes back unchanged.
    ``"https://u:p@ss@h/m?sig=x"`` -> ``"https://***@h/m?***"``."""
    userinfo, query, fragment = _parts(value)
    shown = value
    if fragment is not None:
        shown = shown[: shown.index("#")] + "#" + MASK
    if query is not None:
        shown = shown[: shown.index("?")] + "?" + MASK + shown[shown.index("?") + 1 + len(query) :]
    if userinfo is not None:
        shown = shown.replace(userinfo + "@", MASK + "@", 1)
    return shown


def hide_in_logs(value: str) -> str:
    """Register ``value``'s secret parts (its user information, query and fragment, each of 6
    characters or more, as given and without surrounding white space) so that :func:`masked`,
    and with it every opskit log formatter of this process, writes ``***`` for them from now
    on. Returns :func:`shown_location` of ``value``. Idempotent; thread-safe; a path or hub
    name registers nothing."""
    with _lock:
        for part in _parts(value):
            for text in {part, part.strip()} if part is not None else ():
                if len(text) >= _MIN_SECRET:
                    _hidden[text] = MASK
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
