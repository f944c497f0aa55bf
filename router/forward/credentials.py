"""The router's own credentials for its replicas (a vLLM started with ``--api-key``).

A backend key is never written into a replica list or a setting as a literal: settings name
where it lives (:class:`SecretRef`: a file, e.g. a mounted Kubernetes Secret, or an
environment variable), and the key is read once, when the router starts or a replica is
added. It is sent as ``Authorization: Bearer <key>``. The client's own key is a different
thing: it authenticates the client to the router and is not forwarded unless
``forward_client_key`` says so (router/forward/forwarder.py ``Forwarder.open``).

Errors name the file or the variable, never the value.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, model_validator

from router.errors import RouterError

log = logging.getLogger("router")

MAX_KEY_BYTES = 4096  # a key file larger than this is refused (a wrong path, not a key)
ANY_POOL = "*"


class CredentialError(RouterError):
    """A backend key cannot be read: the file is missing, unreadable, empty, too large or not
    one line of printable ASCII; or the environment variable is unset or empty."""


class SecretRef(BaseModel):
    """Where a secret lives: exactly one of ``file`` (path; the key is its content, surrounding
    whitespace stripped) or ``env`` (the name of an environment variable)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: Path | None = None
    env: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretRef:
        if (self.file is None) == (self.env is None):
            raise ValueError("give exactly one of `file` (a path) or `env` (a variable name), never the key itself")
        return self

    def describe(self) -> str:
        """``file /path`` or ``env NAME``: for messages (never the value)."""
        return f"file {self.file}" if self.file is not None else f"env {self.env}"

    def read(self) -> str:
        """The secret, stripped. Raises CredentialError (naming the file or variable)."""
        if self.file is not None:
            try:
                with self.file.open("rb") as handle:
                    data = handle.read(MAX_KEY_BYTES + 1)
            except OSError as exc:
                raise CredentialError(f"{self.describe()}: cannot read: {exc.strerror or type(exc).__name__}") from None
            if len(data) > MAX_KEY_BYTES:
                raise CredentialError(f"{self.describe()}: larger than {MAX_KEY_BYTES} bytes, not a key")
            value = data.decode("ascii", errors="replace").strip()
        else:
            assert self.env is not None
            value = os.environ.get(self.env, "").strip()
            if not value:
                raise CredentialError(f"{self.describe()}: not set or empty")
        if not value:
            raise CredentialError(f"{self.describe()}: empty")
        if not value.isprintable() or not value.isascii() or any(c.isspace() for c in value):
            raise CredentialError(f"{self.describe()}: not one token of printable ASCII")
        return value


class Credentials:
    """Backend ``Authorization`` header values per replica.

    ``backend_keys``: pool name (or ``"*"`` for every other pool) -> SecretRef; a replica's own
    ``backend_key`` (router/settings.py ReplicaSpec) wins over its pool's, its pool's over
    ``"*"``. Every reference is read at construction or in :meth:`check`, so a missing key stops
    the start-up (CredentialError), not a request.
    """

    def __init__(self, backend_keys: Mapping[str, SecretRef]) -> None:
        self._refs = dict(backend_keys)
        self._values: dict[SecretRef, str] = {}
        for pool, ref in self._refs.items():
            self._load(ref, f"pool {pool}")

    def _load(self, ref: SecretRef, owner: str) -> str:
        value = self._values.get(ref)
        if value is None:
            try:
                value = self._values[ref] = ref.read()
            except CredentialError as exc:
                raise CredentialError(f"backend key of {owner}: {exc}") from None
        return value

    def check(self, specs: Iterable[object]) -> None:
        """Read the keys of ``specs`` (ReplicaSpec) now; raises CredentialError."""
        for spec in specs:
            ref = getattr(spec, "backend_key", None)
            if ref is not None:
                self._load(ref, f"replica {getattr(spec, 'url', '?')}")

    def authorization(self, url: str, pool: str, ref: SecretRef | None) -> str | None:
        """``Bearer <key>`` for a replica at ``url`` of ``pool`` (own ``ref`` first), or None
        when no key is configured for it. A reference that cannot be read (a replica discovered
        after start-up) is logged, naming where it looked, and gives None."""
        ref = ref or self._refs.get(pool) or self._refs.get(ANY_POOL)
        if ref is None:
            return None
        try:
            return "Bearer " + self._load(ref, f"replica {url}")
        except CredentialError as exc:
            log.error("%s: requests go out without a backend key", exc)
            return None
