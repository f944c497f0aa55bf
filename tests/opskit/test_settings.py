"""Settings from the YAML file named by PROMPTEDGE_SETTINGS_FILE (pydantic-settings'
YamlConfigSettingsSource, one section per settings class), under the environment in priority;
typos and missing files are errors; the settings listing names every env variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic_settings import SettingsError

from cache.settings import CacheSettings
from forecaster.settings import ForecasterSettings
from opskit import SETTINGS_FILE_ENV, section_name, settings_table
from router.discovery.kube import KubeDiscoverySettings
from router.settings import RouterSettings
from sim.node.settings import NodeSettings
from sim.replica.settings import SimSettings
from tests.deploy.test_deploy_settings import env_names, use_env

FILE = """
router:
  port: 9100
  replicas: [{url: "http://10.0.0.5:8000", model: llama}]
cache:
  ttl_s: 600
forecaster:
  redis_url: redis://central:6379/2
  step_s: 30
"""


@pytest.fixture()
def settings_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    use_env(monkeypatch, {})
    path = tmp_path / "settings.yaml"
    path.write_text(FILE)
    monkeypatch.setenv(SETTINGS_FILE_ENV, str(path))
    return path


def test_each_class_reads_its_section(settings_file: Path) -> None:
    router = RouterSettings()
    assert router.port == 9100 and [r.url for r in router.replicas] == ["http://10.0.0.5:8000"]
    assert CacheSettings().ttl_s == 600
    forecaster = ForecasterSettings()
    assert (forecaster.redis_url, forecaster.step_s) == ("redis://central:6379/2", 30.0)
    assert SimSettings().port == SimSettings.model_fields["port"].default  # no sim section: defaults


def test_the_environment_wins_over_the_file(settings_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMPTEDGE_ROUTER_PORT", "9200")
    monkeypatch.setenv("PROMPTEDGE_REDIS_URL", "redis://pop:6379/0")
    assert RouterSettings().port == 9200
    assert ForecasterSettings().redis_url == "redis://pop:6379/0"


def test_a_misspelt_key_is_an_error(settings_file: Path) -> None:
    settings_file.write_text("router:\n  prot: 9100\n")
    with pytest.raises(SettingsError, match=r"section 'router' has unknown settings \['prot'\]"):
        RouterSettings()


def test_a_missing_file_is_an_error(settings_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SETTINGS_FILE_ENV, str(settings_file.parent / "nope.yaml"))
    with pytest.raises(SettingsError, match="no such file"):
        CacheSettings()


def test_sections_follow_the_env_prefixes() -> None:
    assert [
        section_name(c) for c in (RouterSettings, KubeDiscoverySettings, CacheSettings, SimSettings, NodeSettings)
    ] == ["router", "router_k8s", "cache", "sim", "sim_node"]


@pytest.mark.parametrize(
    "classes", [(RouterSettings, KubeDiscoverySettings, CacheSettings), (SimSettings, NodeSettings)]
)
def test_the_listing_names_every_setting(classes: tuple) -> None:
    listed = {line.split()[0] for line in settings_table(classes).splitlines()[2:]}
    assert listed <= set().union(*map(env_names, classes))
    assert len(listed) == sum(len(c.model_fields) for c in classes)


def test_router_serve_refuses_a_bad_settings_file(tmp_path: Path) -> None:
    """As a user meets it: exit 2 with the key named, no traceback."""
    (tmp_path / "s.yaml").write_text("router:\n  replica: []\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROMPTEDGE_")}
    proc = subprocess.run(
        [sys.executable, "-m", "router", "serve"],
        env={**env, SETTINGS_FILE_ENV: str(tmp_path / "s.yaml")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "unknown settings ['replica']" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (b'router:\n  admin_key: "sk-admin-hunter2\n  port: 1\n', "line 2, column 14"),  # unterminated quote
        (b'router:\n  api_keys: {"sk-live-hunter2": team-a, port: 1\n', "line 2, column 13"),  # unclosed mapping
    ],
)
def test_a_file_that_is_not_yaml_is_named_with_its_line_and_never_echoed(
    settings_file: Path, text: bytes, where: str
) -> None:
    """PyYAML's message quotes the offending line: a malformed line holding a key put the key in
    the log (attack review Dec 2 #2)."""
    settings_file.write_bytes(text)
    with pytest.raises(SettingsError) as info:
        RouterSettings()
    message = str(info.value)
    assert str(settings_file) in message and where in message and "hunter2" not in message


def test_a_file_that_is_not_utf8_is_an_error_not_a_traceback(settings_file: Path) -> None:
    settings_file.write_bytes(b'router:\n  admin_key: "sk-admin-hunter2"\n  port: \xff\n')
    with pytest.raises(SettingsError, match="not UTF-8") as info:
        RouterSettings()
    assert "hunter2" not in str(info.value)


def test_the_listing_says_what_an_unset_threshold_means() -> None:
    # "-" for THRESHOLD read as "no floor" to a fresh user; unset, it is each stage's own floor
    from cache.settings import RULES_THRESHOLD
    from cache.verify.learned import load_verifier

    rows = {line.split()[0]: line for line in settings_table((CacheSettings,)).splitlines()[2:]}
    line = rows["PROMPTEDGE_CACHE_THRESHOLD"]
    assert f"{RULES_THRESHOLD:.2f}" in line and f"{load_verifier().min_cosine:.2f}" in line
    assert " - " not in line
    assert "off" in rows["PROMPTEDGE_CACHE_ERROR_BOUND"]
