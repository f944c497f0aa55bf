"""deploy/monitoring: the alert rules pass promtool and its unit tests (each alert fires and
stays silent), the operator's PrometheusRule holds the same rules, the scrape config and the
monitors reach the overlays' Pods, and every dashboard panel's PromQL parses and reads series
the code really exports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.kustomize import DEPLOY, needs_kustomize, one, render, rendered
from tests.deploy.promtool import VLLM_NOT_SIMULATED, exported_names, metric_names, needs_promtool, promtool
from tests.deploy.test_deploy_wiring import selects

MONITORING = DEPLOY / "monitoring"
RULES = MONITORING / "prometheus" / "promptedge-rules.yaml"
ALERT_TESTS = Path(__file__).parent / "promtool" / "promptedge-alerts.test.yaml"
DASHBOARD = MONITORING / "grafana" / "promptedge.json"


def rules() -> dict[str, Any]:
    return yaml.safe_load(RULES.read_text())


def alerts() -> list[dict[str, Any]]:
    return [rule for group in rules()["groups"] for rule in group["rules"]]


def panel_exprs() -> list[str]:
    return [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]]


def test_prometheusrule_holds_the_same_groups_as_the_rules_file() -> None:
    (rule,) = yaml.safe_load_all((MONITORING / "prometheusrule.yaml").read_text())
    assert rule["spec"] == rules(), (
        "edit deploy/monitoring/prometheusrule.yaml and prometheus/promptedge-rules.yaml together"
    )


def test_every_alert_has_a_severity_summary_and_runbook() -> None:
    names = [a["alert"] for a in alerts()]
    assert len(names) == len(set(names)) >= 6
    for alert in alerts():
        assert alert["labels"]["severity"] in ("warning", "critical")
        assert alert["annotations"]["summary"] and len(alert["annotations"]["runbook"]) > 80


def test_rules_and_dashboard_read_only_exported_series() -> None:
    exported = exported_names()
    for expr in [a["expr"] for a in alerts()] + panel_exprs():
        assert metric_names(expr) <= exported, f"not exported: {metric_names(expr) - exported} in {expr}"


def test_metric_names_are_found_in_promql() -> None:
    assert metric_names('rate({__name__=~"vllm:a_bucket|vllm:b_bucket"}[5m]) / promptedge_x_total') == {
        "vllm:a_bucket",
        "vllm:b_bucket",
        "promptedge_x_total",
    }


@needs_promtool
def test_promtool_checks_the_rules() -> None:
    done = promtool("check", "rules", RULES)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_every_alert_fires_and_stays_silent_in_promtool_unit_tests(tmp_path: Path) -> None:
    tested = yaml.safe_load(ALERT_TESTS.read_text())
    covered = {t["alertname"] for case in tested["tests"] for t in case["alert_rule_test"]}
    assert covered == {a["alert"] for a in alerts()}
    # promtool compares annotations too; they are prose (checked above), so the unit tests
    # run on the rules without them: expressions, `for` and labels as shipped.
    bare = rules()
    for group in bare["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(bare))
    (tmp_path / ALERT_TESTS.name).write_text(ALERT_TESTS.read_text())
    done = promtool("test", "rules", ALERT_TESTS.name, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    """promtool has no offline PromQL parser of its own: each query becomes a recording rule."""
    recorded = [{"record": f"promptedge:panel_{i}", "expr": e} for i, e in enumerate(panel_exprs())]
    (tmp_path / "panels.yaml").write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": recorded}]}))
    done = promtool("check", "rules", tmp_path / "panels.yaml")
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_promtool_checks_the_plain_scrape_config(tmp_path: Path) -> None:
    config = yaml.safe_load((MONITORING / "prometheus" / "prometheus.yml").read_text())
    assert {job["job_name"] for job in config["scrape_configs"]} == {
        "promptedge-router",
        "promptedge-forecaster",
        "promptedge-vllm",
    }
    done = promtool("check", "config", MONITORING / "prometheus" / "prometheus.yml")
    if "kubernetes_sd_configs not found" in done.stdout + done.stderr:
        # Debian builds Prometheus without Kubernetes service discovery: check the rest of the
        # file (rule files, relabelling) with each discovery replaced by a static target.
        for job in config["scrape_configs"]:
            job["static_configs"] = [{"targets": ["127.0.0.1:9"]}]
            del job["kubernetes_sd_configs"]
        (tmp_path / "promptedge-rules.yaml").write_text(RULES.read_text())
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        done = promtool("check", "config", tmp_path / "prometheus.yml")
    assert done.returncode == 0, done.stdout + done.stderr


@needs_kustomize
def test_monitors_select_the_overlays_pods_and_ports() -> None:
    monitors = render(MONITORING)
    edge, central = rendered("edge-pop"), rendered("central")
    for name, objects in (("promptedge-router", edge), ("promptedge-forecaster", central)):
        monitor, service = one(monitors, "ServiceMonitor", name), one(objects, "Service", name)
        assert selects(monitor["spec"]["selector"], service["metadata"]["labels"])
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    pods = one(monitors, "PodMonitor", "promptedge-vllm")["spec"]
    vllm = one(edge, "Deployment", "vllm")["spec"]["template"]
    assert selects(pods["selector"], vllm["metadata"]["labels"])
    assert {e["port"] for e in pods["podMetricsEndpoints"]} <= {
        p["name"] for p in vllm["spec"]["containers"][0]["ports"]
    }


def test_the_forecast_offset_is_the_default_lead_time() -> None:
    """The offset in the rule and the dashboard is WARMUP_S (+ ACTUATION_DELAY_S) rounded to minutes."""
    from forecaster.settings import ForecasterSettings

    lead_min = round(ForecasterSettings().planner().lead_time_s / 60)
    (expr,) = [a["expr"] for a in alerts() if a["alert"] == "PromptEdgeForecastAboveBand"]
    assert f"offset {lead_min}m" in expr
    assert all(f"offset {lead_min}m" in e for e in panel_exprs() if "offset" in e)


def test_the_forecasters_default_query_reads_what_vllm_and_the_sim_export() -> None:
    """forecaster/settings.py's default ``prometheus_query`` reads vLLM's request counter, which
    the simulated replica exports under the same name (the live test below evaluates it)."""
    from forecaster.settings import ForecasterSettings

    query = ForecasterSettings.model_fields["prometheus_query"].default
    assert metric_names(query) == {"vllm:request_success_total"}
    assert metric_names(query) <= exported_names() - VLLM_NOT_SIMULATED
