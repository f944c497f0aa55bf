"""docs/configuration.md is generated from the settings classes (tools/configuration_doc.py):
this fails when a setting was added, removed, renamed or given another default or comment and
the page was not written again, so the page never documents settings the code does not have."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("configuration_doc", ROOT / "tools" / "configuration_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configuration_page_matches_the_settings_classes() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == _tool().render(), "docs/configuration.md is stale: run python tools/configuration_doc.py --write"


def test_every_settings_class_and_field_is_on_the_page() -> None:
    tool = _tool()
    page = (ROOT / "docs" / "configuration.md").read_text()
    from opskit import env_name

    classes = tool.settings_classes()
    assert {c.__name__ for c in classes} >= {
        "RouterSettings",
        "CacheSettings",
        "ForecasterSettings",
        "ActuatorSettings",
        "SimSettings",
        "NodeSettings",
        "KubeDiscoverySettings",
    }
    for cls in classes:
        for name, field in cls.model_fields.items():
            assert f"`{env_name(cls, name, field)}`" in page, (cls.__name__, name)
