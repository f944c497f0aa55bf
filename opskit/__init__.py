"""What every PromptEdge process shares to be operable: one log format, settings that can also
come from a YAML file, and a listing of every setting with its env name and default.

Public surface: :func:`configure` (root logging on stderr, uvicorn's loggers folded into it),
:class:`JsonFormatter`, :class:`TextFormatter`, :data:`FORMATS`, :data:`LogFormat`;
:class:`FileSettings` (a BaseSettings reading ``PROMPTEDGE_SETTINGS_FILE`` too),
:data:`SETTINGS_FILE_ENV`, :func:`settings_table`, :func:`settings_error` (a settings error on one line, without values), :func:`env_name`, :func:`section_name`;
Redis URLs of every topology (one server, Redis Cluster, Sentinel): :func:`parse_redis_url`,
:class:`RedisTarget`, :class:`RedisURLError`, :data:`RedisURL` (a settings field type),
:func:`redact_url`; :func:`hide_in_logs`, :func:`masked` (a location setting's credentials kept out of logs and responses); :func:`output_path_error` (an output file checked before the work); the Redis keys and the document the router and the forecaster share
(``TRAFFIC_*``, ``FORECAST_*``, :func:`traffic_key`, :func:`traffic_field`,
:func:`forecast_document`, :func:`read_forecast`, :class:`Forecast`); their redis-py clients are in :mod:`opskit.redis_client` (``async_redis``,
``sync_redis``), which this surface does not import.
Standard library, PyYAML and pydantic-settings only, so the product packages and ``sim`` can all
use it without importing each other (pyproject.toml's import-linter contracts).
"""

from opskit._contracts import (
    ALL_POOLS,
    FORECAST_KEY,
    FORECAST_VERSION,
    MAX_FORECAST_BYTES,
    TRAFFIC_FIELDS,
    TRAFFIC_KEY,
    TRAFFIC_MARKERS,
    TRAFFIC_MODELS_KEY,
    TRAFFIC_TTL_S,
    Forecast,
    forecast_document,
    read_forecast,
    traffic_field,
    traffic_key,
)
from opskit._logfmt import FORMATS, JsonFormatter, LogFormat, TextFormatter, configure
from opskit._paths import output_path_error
from opskit._redact import hide_in_logs, masked
from opskit._redis_url import RedisTarget, RedisURL, RedisURLError, parse_redis_url, redact_url
from opskit._settings import (
    SETTINGS_FILE_ENV,
    FileSettings,
    env_name,
    section_name,
    settings_error,
    settings_table,
    unset_meaning,
)

__all__ = [
    "ALL_POOLS",
    "FORECAST_KEY",
    "FORECAST_VERSION",
    "FORMATS",
    "MAX_FORECAST_BYTES",
    "SETTINGS_FILE_ENV",
    "TRAFFIC_FIELDS",
    "TRAFFIC_KEY",
    "TRAFFIC_MARKERS",
    "TRAFFIC_MODELS_KEY",
    "TRAFFIC_TTL_S",
    "FileSettings",
    "Forecast",
    "JsonFormatter",
    "LogFormat",
    "RedisTarget",
    "RedisURL",
    "RedisURLError",
    "TextFormatter",
    "configure",
    "env_name",
    "forecast_document",
    "hide_in_logs",
    "masked",
    "output_path_error",
    "parse_redis_url",
    "read_forecast",
    "redact_url",
    "section_name",
    "settings_error",
    "settings_table",
    "traffic_field",
    "traffic_key",
    "unset_meaning",
]
