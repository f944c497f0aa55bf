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


def shown_location(value: str) -> str:
    """``value`` (a path, hub name or URL) as logs and responses show it: user information
    becomes ``***@``, the whole query ``?***`` and a fragment ``#***``; a value with none comes
    back unchanged. ``"https://u:p/s@h/m?sig=x"`` -> ``"https://***@h/m?***"``."""
    prefix, userinfo, rest = _split(value)
    before_fragment, hash_sep, fragment = rest.partition("#")
    path, query_sep, query = before_fragment.partition("?")
    shown = prefix + (MASK + "@" if userinfo is not None else "") + path
    if query_sep:
        shown += "?" + (MASK if query else "")
    if hash_sep:
        shown += "#" + (MASK if fragment else "")
    return shown


def _registrable(text: str) -> bool:
    # a word ("tokens", "request") would garble every log line that holds it, keys included;
    # credentials carry digits or symbols, or are long
    return len(text) >= _MIN_SECRET and (not text.isalpha() or len(text) >= 16)


def hide_in_logs(value: str) -> str:
    """Register ``value``'s secret parts (its user information, query and fragment: as given,
    without surrounding white space, and as ``repr`` escapes them; each of 6 characters or
    more, and not a word under 16 letters) so that :func:`masked`, and with it every opskit
    log formatter of this process, writes ``***`` for them from now on. Returns
    :func:`shown_location` of ``value``. Idempotent; thread-safe; a path or hub name registers
    nothing."""
    with _lock:
        for part in _parts(value):
            if part is None:
                continue
            for text in {part, part.strip(), repr(part)[1:-1], repr(part.strip())[1:-1]}:
                if _registrable(text):
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
