"""Credentials a location setting carries, kept out of logs and responses.

A model setting is a path or a hub name, but it may be a URL with ``user:password@`` or a
query such as ``?token=...``; the error messages of the code and of the libraries that load it
quote it verbatim, and the router shows those on unauthenticated routes (/health,
/cache/stats). :func:`hide_in_logs` registers the setting's secret parts, and :func:`masked`,
which every opskit log formatter applies, replaces them. Exact substrings, not patterns: a
pattern both misses secrets (a password with an ``@``, ``sig=``, ``accessToken=``) and masks
what is not one (a request id ``sk-...``, ``hf_hub_download`` in a traceback)."""

from __future__ import annotations

import threading

MASK = "***"
_MIN_SECRET = 6  # shorter parts are not registered: masking "token" would garble every access line
_hidden: tuple[str, ...] = ()  # the registered secret parts, longest first (one containing another is masked whole)
_lock = threading.Lock()


def _split(value: str) -> tuple[str, str | None, str]:
    """(prefix, user information, rest) of ``value``. The user information runs to the last
    ``@`` after ``scheme://`` or a leading ``//`` (people paste raw passwords holding ``/``,
    ``?``, ``#`` or ``@``), or, without either, to the last ``@`` of a value with a ``:``
    before it (``user:pw@host/m``, which a hub-name parser quotes back); None for a path or
    hub name."""
    if "://" in value:
        prefix, _, rest = value.partition("://")
        prefix += "://"
    elif value.startswith("//"):
        prefix, rest = "//", value[2:]
    else:
        prefix, rest = "", value
        if "@" not in rest or ":" not in rest[: rest.rindex("@")]:
            return prefix, None, rest
    if "@" not in rest:
        return prefix, None, rest
    userinfo, _, after = rest.rpartition("@")
    return prefix, userinfo or None, after


def _parts(value: str) -> tuple[str | None, str | None, str | None]:
    """(user information, query, fragment) of ``value``: see :func:`_split`; the query is what
    follows the first ``?`` after the user information (up to a ``#``), the fragment what
    follows the first ``#``; None where absent or empty."""
    _, userinfo, rest = _split(value)
    before_fragment, hash_sep, fragment = rest.partition("#")
    _, query_sep, query = before_fragment.partition("?")
    return userinfo, (query if query_sep and query else None), (fragment if hash_sep and fragment else None)


def _registrable(text: str) -> bool:
    # a word ("tokens", "request") would garble every log line that holds it, keys included;
    # credentials carry digits or symbols, or are long
    return len(text) >= _MIN_SECRET and (not text.isalpha() or len(text) >= 16)


def hide_in_logs(value: str) -> None:
    """Register ``value``'s secret parts (its user information, query and fragment: as given,
    without surrounding white space, and as ``repr`` escapes them; each of 6 characters or
    more, and not a word under 16 letters) so that :func:`masked`, and with it every opskit
    log formatter of this process, writes ``***`` for them from now on. Idempotent;
    thread-safe; a path or hub name registers nothing.
    ``"https://u:p/s@h/m?sig=x1"`` then shows as ``"https://***@h/m?***"``."""
    global _hidden
    found = set()
    for part in _parts(value):
        if part is not None:
            found |= {
                text for text in {part, part.strip(), repr(part)[1:-1], repr(part.strip())[1:-1]} if _registrable(text)
            }
    if found:
        with _lock:
            _hidden = tuple(sorted(set(_hidden) | found, key=len, reverse=True))


def masked(text: str) -> str:
    """``text`` with every registered secret part replaced by ``***``. Costs one check of an
    empty tuple while none is registered (every log line of the process passes here)."""
    for secret in _hidden:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def forget_hidden() -> None:
    """Empty the registry (tests)."""
    global _hidden
    with _lock:
        _hidden = ()
