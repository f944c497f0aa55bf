"""Settings from a YAML file besides the environment, and the listing of every setting.

One file for every package, named by ``PROMPTEDGE_SETTINGS_FILE`` (for example mounted from a
ConfigMap), with one section per settings class: the class's env prefix without
``PROMPTEDGE_`` in lower case (``router``, ``router_k8s``, ``cache``, ``forecaster``,
``actuator``, ``sim``, ``sim_node``), keys the field names::

    router:
      port: 8000
      replicas: [{url: "http://10.0.0.5:8000", model: llama-3.1-8b}]
    cache:
      ttl_s: 600

Priority, highest first: arguments, environment variables, the file, defaults. pydantic-settings'
own ``YamlConfigSettingsSource`` reads the section; a missing file, a section that is not a
mapping, or a key no field has (a typo would silently keep the default) is a SettingsError.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import AliasChoices, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsError, YamlConfigSettingsSource

SETTINGS_FILE_ENV = "PROMPTEDGE_SETTINGS_FILE"


def section_name(settings_cls: type[BaseSettings]) -> str:
    """The YAML section of ``settings_cls``: ``PROMPTEDGE_ROUTER_K8S_`` -> ``router_k8s``."""
    prefix = str(settings_cls.model_config.get("env_prefix", ""))
    return prefix.removeprefix("PROMPTEDGE_").strip("_").lower()


def _keys(settings_cls: type[BaseSettings]) -> set[str]:
    keys = set()
    for name, field in settings_cls.model_fields.items():
        keys.add(name)
        alias = field.validation_alias
        if isinstance(alias, str):
            keys.add(alias)
        elif isinstance(alias, AliasChoices):
            keys.update(str(choice) for choice in alias.choices)
    return keys


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """Where and what a YAML error is, without PyYAML's quote of the line (which may be a
    secret's: a malformed ``admin_key`` or API key line would reach the log)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or type(exc).__name__
    context = getattr(exc, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    context_mark = getattr(exc, "context_mark", None)
    if context and context_mark is not None:
        context = f"{context} at line {context_mark.line + 1}, column {context_mark.column + 1}"
    return where + problem + (f" ({context})" if context else "")


def _section(settings_cls: type[BaseSettings], path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        raise SettingsError(f"{SETTINGS_FILE_ENV}: no such file {path}")
    try:
        document = yaml.safe_load(path.read_bytes().decode()) or {}
    except UnicodeDecodeError as exc:
        raise SettingsError(f"{SETTINGS_FILE_ENV} {path}: not UTF-8 (byte {exc.start})") from None
    except OSError as exc:
        raise SettingsError(f"{SETTINGS_FILE_ENV} {path}: cannot be read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise SettingsError(f"{SETTINGS_FILE_ENV} {path}: not YAML: {_yaml_problem(exc)}") from None
    section = section_name(settings_cls)
    if not isinstance(document, dict):
        raise SettingsError(f"{SETTINGS_FILE_ENV} {path}: a mapping of sections expected")
    if section not in document:
        return None
    values = document[section]
    if not isinstance(values, dict):
        raise SettingsError(f"{SETTINGS_FILE_ENV} {path}: section {section!r} is not a mapping")
    unknown = sorted(set(values) - _keys(settings_cls))
    if unknown:
        raise SettingsError(f"{SETTINGS_FILE_ENV} {path}: section {section!r} has unknown settings {unknown}")
    return values


def _aliases(settings_cls: type[BaseSettings]) -> dict[str, str]:
    """Field name -> the alias pydantic validates by, for the fields that have one."""
    found = {}
    for name, field in settings_cls.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, str):
            found[name] = alias
        elif isinstance(alias, AliasChoices):
            found[name] = str(alias.choices[0])
    return found


class _SectionSource(YamlConfigSettingsSource):
    """pydantic-settings' YAML source over one section, where a field with an alias (the
    shared ``redis_url``) is also written by its field name, like every other key."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path) -> None:
        self._renames = _aliases(settings_cls)
        self._section_key = section_name(settings_cls)
        super().__init__(settings_cls, yaml_file=path, yaml_config_section=self._section_key)

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        data = super()._read_file(file_path)
        section = data.get(self._section_key)
        if isinstance(section, dict):
            data[self._section_key] = {self._renames.get(k, k): v for k, v in section.items()}
        return data


class FileSettings(BaseSettings):
    """A BaseSettings whose values can also come from ``PROMPTEDGE_SETTINGS_FILE`` (see module)."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments, environment, .env, the YAML section (when the file has one), secrets."""
        path = os.environ.get(SETTINGS_FILE_ENV)
        if not path or _section(settings_cls, Path(path)) is None:
            return init_settings, env_settings, dotenv_settings, file_secret_settings
        return (
            init_settings,
            env_settings,
            dotenv_settings,
            _SectionSource(settings_cls, Path(path)),
            file_secret_settings,
        )


def env_name(settings_cls: type[BaseSettings], name: str, field: FieldInfo) -> str:
    """The environment variable that sets field ``name``: its alias (the first of several), else
    the class's env prefix + the name, upper-cased."""
    alias = _aliases(settings_cls).get(name) if field.validation_alias is not None else None
    return (alias or f"{settings_cls.model_config.get('env_prefix', '')}{name}").upper()


def settings_error(exc: ValidationError | SettingsError, *classes: type[BaseSettings]) -> str:
    """A settings error on one line, ``ENV_NAME: message`` per error joined by ``"; "``:
    pydantic's own text spans several lines, adds a link, names the field rather than the
    variable a user sets, and quotes the input (a rule across fields quotes every setting,
    passwords included), so values are never repeated. ``classes``: the settings classes the
    error may come from, matched by its title (the first field name of a location becomes that
    class's env name); a rule across fields is named by the title. A SettingsError (a list or
    dict setting that is not JSON, a bad settings file) is its own text, which names no value."""
    if not isinstance(exc, ValidationError):
        return str(exc)
    cls = {c.__name__: c for c in classes}.get(exc.title)
    parts = []
    for error in exc.errors(include_url=False):
        loc = [str(p) for p in error["loc"]]
        if cls is not None and loc and loc[0] in cls.model_fields:
            loc[0] = env_name(cls, loc[0], cls.model_fields[loc[0]])
        message = error["msg"].removeprefix("Value error, ")  # a validator's own text follows it
        parts.append(f"{'.'.join(loc) or exc.title}: {message}")
    return "; ".join(parts)


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "(required)"
    else:
        value = field.default
    if field.repr is False and value:
        return "(secret)"
    if value is None:
        return f"(unset: {unset})" if (unset := unset_meaning(field)) else "(unset)"
    return repr(value) if isinstance(value, str) else str(value)


def unset_meaning(field: FieldInfo) -> str | None:
    """What a setting left at None means (``Field(json_schema_extra={"unset": ...})``), e.g.
    "off" or "one per CPU"; None when the field does not say."""
    extra = field.json_schema_extra
    meaning = extra.get("unset") if isinstance(extra, dict) else None
    return meaning if isinstance(meaning, str) else None


def settings_table(classes: tuple[type[BaseSettings], ...]) -> str:
    """Every setting of ``classes`` as text lines ``ENV_NAME  default  [section.key in the file]``,
    one per field, with a header naming the settings file's variable."""
    rows = [
        (env_name(c, n, f), _default(f), f"{section_name(c)}.{n}") for c in classes for n, f in c.model_fields.items()
    ]
    width = max(len(r[0]) for r in rows)
    lines = [f"Environment variables (or the YAML file named by {SETTINGS_FILE_ENV}, section.key):", ""]
    lines += [f"{env.ljust(width)}  {default}  [{key}]" for env, default, key in rows]
    return "\n".join(lines)
