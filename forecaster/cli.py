"""``python -m forecaster``: run --once (cron), daemon, backtest.

Exit codes of ``run --once`` (forecaster.scheduler.ExitCode): 0 decided and carried out; 1 held
the last decision (source unreachable, empty, or its last bucket missing); 2 bad input (flags,
settings, a trace row: the message names file, line and column); 3 actuation failed.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from prometheus_client import start_http_server
from pydantic import ValidationError
from pydantic_settings import SettingsError

from forecaster.actuate import build_actuator, load_actuator_settings
from forecaster.errors import ForecasterError
from forecaster.live import cycle, daemon_job
from forecaster.plan import PLANNER_DEFAULTS as _PLAN
from forecaster.run import RunResult, run_once
from forecaster.scheduler import ExitCode, run_daemon
from forecaster.series import demand
from forecaster.settings import ForecasterSettings
from forecaster.sources import TraceSource, open_source
from opskit import RedisURLError, output_path_error, settings_error, settings_table
from opskit import configure as configure_logging
from opskit.redis_client import check_redis_url

# The help texts below are for users (typer shows them as given); docstrings stay for developers.
# The backtest's flags default as the live forecaster does: the planner's knobs from
# PLANNER_DEFAULTS, the forecasting ones from ForecasterSettings (read without the environment).
_FORECASTING = ForecasterSettings.model_construct()

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="PromptEdge forecaster: forecasts request volume and plans replicas ahead of demand by their warm-up time.",
)


log = logging.getLogger("forecaster.cli")


def _internal(message: str) -> int:
    """Print ``error: message`` and return the exit code of a report that could not be built (1:
    nothing could be known; not 2, which says the input was bad)."""
    typer.echo(f"error: {message}", err=True)
    return int(ExitCode.HOLD)


def _settings_error(exc: ValidationError | SettingsError) -> str:
    """``settings: ENV_NAME: message; ...`` (opskit.settings_error: the values are not
    repeated, they may hold passwords)."""
    from forecaster.actuate.settings import ActuatorSettings

    return f"settings: {settings_error(exc, ForecasterSettings, ActuatorSettings)}"


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(int(ExitCode.BAD_INPUT))


def _check_outputs(*outputs: tuple[str, Path | None]) -> None:
    """Refuse, before any work, an output file that could not be written at the end (a folder,
    an unwritable place): a one-line error naming the option (exit 2), not a traceback."""
    for option, path in outputs:
        error = output_path_error(option, path)
        if error is not None:
            raise _fail(error)


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M")


def print_plan(result: RunResult) -> None:
    """Plan table, then the model and the decision with its reason."""
    series = result.series
    before = series.get("missing_before_first", 0)
    typer.echo(
        f"series {series.get('name', '?')}: {series.get('buckets', 0)} buckets of "
        f"{series.get('step_s', 0):g} s, {series.get('missing_buckets', 0)} missing"
        f"{f' ({before} of them before the first counted bucket)' if before else ''}, "
        f"demand in {series.get('demand_unit', '?')}"
    )
    typer.echo(f"model  {result.model}: {result.note}")
    if result.steps:
        typer.echo(f"{'ahead':>7}  {'bucket start (UTC)':18}  {'forecast':>10}  {'upper':>10}  {'replicas':>8}")
        for step in result.steps:
            ahead = (step.start - result.steps[0].start) / 60
            typer.echo(
                f"{ahead:>5.0f} m  {_clock(step.start):18}  {step.forecast:>10.3f}  "
                f"{step.upper:>10.3f}  {step.replicas:>8d}"
            )
    d = result.decision
    typer.echo(f"decision: {d.replicas} replicas ({d.action}): {d.reason}")


@app.callback()
def _group() -> None:
    """PromptEdge forecaster: plans replicas ahead of demand by the warm-up time."""


@app.command(
    help=(
        "Forecast the next 30 minutes, decide the replicas and carry the decision out "
        "(PROMPTEDGE_ACTUATOR_MODE: advisory by default -- records the decision for 'report', scales nothing; "
        "dry-run, kubernetes or keda). With --trace: a what-if on a trace."
        " Every setting with its env name and default: python -m forecaster settings."
        "\n\n"
        "Exit codes: 0 decided and carried out; 1 held the last decision (source unreachable, empty, or its "
        "last bucket missing); 2 bad input (flags, settings, a trace row); 3 actuation failed."
    )
)
def run(
    once: Annotated[bool, typer.Option("--once", help="Plan once and exit (for cron).")] = False,
    trace: Annotated[
        Path | None, typer.Option(help="Read demand from a trace file/folder (what-if: nothing is scaled or saved).")
    ] = None,
    trace_format: Annotated[str, typer.Option(help="auto|azure|mooncake|servegen|burstgpt|generic")] = "auto",
    model_name: Annotated[str | None, typer.Option(help="Router model/pool to plan for.")] = None,
    now: Annotated[
        float | None, typer.Option(help="Unix s to treat as now (default: the clock, PROMPTEDGE_FORECASTER_CLOCK_*).")
    ] = None,
    step: Annotated[float | None, typer.Option(help="Bucket length in s (trace only; default: the trace's).")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the plan as JSON here.")] = None,
) -> None:
    """Forecast the next 30 minutes, decide replicas and carry the decision out
    (PROMPTEDGE_ACTUATOR_MODE: advisory by default, dry-run, kubernetes or keda)."""
    if not once:
        raise _fail("'run' needs --once; use 'daemon' for a schedule")
    _check_outputs(("--json", json_path))
    try:
        settings = ForecasterSettings(**({"model_name": model_name} if model_name else {}))
        if trace is not None:
            source = TraceSource(trace, step, settings.trace_tz, trace_format)
            result = run_once(settings, source, now)
            code = ExitCode.HOLD if result.decision.action == "hold" else ExitCode.OK
            actuation = "what-if on a trace: nothing scaled, no state saved"
        else:
            actuator_settings = load_actuator_settings()
            outcome = cycle(settings, actuator_settings, open_source(settings), build_actuator(actuator_settings), now)
            result, code = outcome.result, outcome.code
            actuation = outcome.actuation.summary() if outcome.actuation else "FAILED (see log)"
    except ForecasterError as exc:
        raise _fail(str(exc)) from None
    except RedisURLError as exc:  # an option redis-py refuses when the client is built (?socket_timeout=abc)
        raise _fail(f"settings: a Redis URL (PROMPTEDGE_REDIS_URL or a source's): {exc}") from None
    except (ValidationError, SettingsError) as exc:
        raise _fail(_settings_error(exc)) from None
    print_plan(result)
    typer.echo(f"actuation: {actuation}")
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result.to_json(), indent=2))
    raise typer.Exit(int(code))


@app.command(
    help=(
        "Plan and act every interval until SIGTERM or Ctrl-C (no overlapping runs; a failed run is logged and "
        "the schedule goes on); serves Prometheus metrics on PROMPTEDGE_FORECASTER_METRICS_PORT (default 9464)."
        " Every setting with its env name and default: python -m forecaster settings."
    )
)
def daemon(
    interval: Annotated[
        float | None,
        typer.Option(
            min=1e-3, help="Simulated seconds between runs, also the planner's decision interval (default: setting)."
        ),
    ] = None,
) -> None:
    """Plan and act every interval (UTC, no overlapping runs, a failed run is logged); serves
    Prometheus metrics on PROMPTEDGE_FORECASTER_METRICS_PORT (9464). The interval is in
    simulated seconds: the schedule fires every interval / PROMPTEDGE_FORECASTER_CLOCK_SCALE
    wall seconds."""
    try:
        settings = ForecasterSettings()
        if interval is not None:
            settings = settings.model_copy(update={"daemon_interval_s": interval})
        check_redis_url(settings.redis_url)  # a bad one is a start-up error, not one per scheduled run
        clock = settings.clock()
        actuator_settings = load_actuator_settings()
        job = daemon_job(settings, actuator_settings, open_source(settings), build_actuator(actuator_settings), clock)
    except ForecasterError as exc:
        raise _fail(str(exc)) from None
    except RedisURLError as exc:  # an option redis-py refuses when the client is built (?socket_timeout=abc)
        raise _fail(f"settings: a Redis URL (PROMPTEDGE_REDIS_URL or a source's): {exc}") from None
    except (ValidationError, SettingsError) as exc:
        raise _fail(_settings_error(exc)) from None
    if settings.metrics_port:
        start_http_server(settings.metrics_port)
    run_daemon(job, clock.to_wall(settings.daemon_interval_s))


def _policy_table(report: dict) -> None:
    typer.echo(
        f"{'policy':14}  {'under-prov. time':>16}  {'under-prov. min':>15}  {'req. share':>10}  {'replica-min':>12}  {'vs oracle':>9}"
    )
    for name, p in report["policies"].items():
        typer.echo(
            f"{name:14}  {p['under_provisioned_frac']:>16.3%}  {p['under_provisioned_minutes']:>15.0f}  "
            f"{p['under_provisioned_request_share']:>10.3%}  {p['replica_minutes']:>12.0f}  "
            f"{p['replica_minutes_vs_oracle']:>9.3f}"
        )


def _forecast_table(report: dict) -> None:
    level = report["forecast"].get("level", 0.9)
    # The planner's band is the P90 band at the default level: one column then, not two alike.
    planner = abs(level - 0.9) > 1e-9
    typer.echo(
        f"{'horizon':>8}  {'MAE':>10}  {'last value':>10}  {'seas. naive':>11}  {'MASE':>6}  {'sMAPE':>6}  "
        f"{'P90 cover':>9}" + (f"  {f'P{level * 100:g} cover':>9}" if planner else "")
    )
    for key in ("forecast", "forecast_30min"):
        f = report[key]
        if f["n"] == 0:
            typer.echo(f"{f['horizon_min']:>6g} m  (test period shorter than the horizon)")
            continue
        sn = "-" if f["mae_seasonal_naive"] is None else f"{f['mae_seasonal_naive']:.4g}"
        p90 = "-" if f["p90_coverage"] is None else f"{f['p90_coverage']:.3f}"
        typer.echo(
            f"{f['horizon_min']:>6g} m  {f['mae']:>10.4g}  {f['mae_last_value']:>10.4g}  {sn:>11}  {f['mase']:>6.3f}  "
            f"{f['smape']:>6.3f}  {p90:>9}" + (f"  {f['upper_coverage']:>9.3f}" if planner else "")
        )


@app.command(help="Replay a trace: predictive scaling against HPA-like, KEDA-like and perfect-foresight scaling.")
def backtest(
    trace: Annotated[Path, typer.Option(help="Trace file or ServeGen folder.")],
    warmup: Annotated[float, typer.Option(help="Replica warm-up (lead time), s.")] = _PLAN.lead_time_s,
    capacity: Annotated[float, typer.Option(help="Demand one replica serves, per s.")] = _PLAN.capacity_per_replica,
    headroom: Annotated[float, typer.Option(help="Extra capacity fraction.")] = _PLAN.headroom,
    trace_format: Annotated[str, typer.Option(help="auto|azure|mooncake|servegen|burstgpt|generic")] = "auto",
    step: Annotated[float | None, typer.Option(help="Bucket length in s (default: the trace's).")] = None,
    tz: Annotated[str, typer.Option(help="Time zone of naive timestamps.")] = "UTC",
    test_fraction: Annotated[float, typer.Option(help="Trailing share of the trace scored.")] = 0.5,
    models: Annotated[str, typer.Option(help="Comma-separated candidate models.")] = ",".join(_FORECASTING.models),
    level: Annotated[
        float, typer.Option(min=0.51, max=0.999, help="Upper quantile the planner provisions for.")
    ] = _FORECASTING.level,
    upper_headroom: Annotated[
        float, typer.Option(help="Headroom over the upper quantile (--headroom is over the mean).")
    ] = _FORECASTING.upper_headroom,
    down_cooldown: Annotated[
        float, typer.Option(help="Scale-down cooldown of the predictive policy, s.")
    ] = _PLAN.down_cooldown_s,
    band_window: Annotated[
        float, typer.Option(help="Trailing mean (s) the band is conditioned on; 0: one band for every origin.")
    ] = _FORECASTING.band_window_s,
    band_scale: Annotated[
        bool, typer.Option(help="Scale the band by the volatility of the --band-window span.")
    ] = _FORECASTING.band_scale,
    head_days: Annotated[
        float | None, typer.Option(help="Use only the first N days of the trace (e.g. to tune on them).")
    ] = None,
    budget: Annotated[
        float, typer.Option(help="Model-selection time budget per refit, s.")
    ] = _FORECASTING.time_budget_s,
    demand_unit: Annotated[str, typer.Option(help="requests|tokens")] = "requests",
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the report as JSON here.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write a PNG plot here.")] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Replay a trace: predictive vs HPA-like, KEDA-like and perfect-foresight scaling."""
    from forecaster.backtest.run import BacktestConfig, run_backtest

    if demand_unit not in ("requests", "tokens"):
        raise _fail(f"--demand-unit must be requests or tokens, got {demand_unit!r}")
    if plot is not None and importlib.util.find_spec("matplotlib") is None:  # say so before the replay
        raise _fail("--plot needs matplotlib: pip install 'promptedge[plot]'")
    _check_outputs(("--json", json_path), ("--plot", plot))
    for flag, value, ok, bound in (
        ("--capacity", capacity, capacity > 0, "> 0"),
        ("--warmup", warmup, warmup >= 0, ">= 0"),
        ("--headroom", headroom, headroom >= 0, ">= 0"),
        ("--upper-headroom", upper_headroom, upper_headroom >= 0, ">= 0"),
        ("--down-cooldown", down_cooldown, down_cooldown >= 0, ">= 0"),
        ("--band-window", band_window, 0 <= band_window <= 7 * 86400, "between 0 and 604800 (a week)"),
        ("--test-fraction", test_fraction, 0 < test_fraction < 1, "in (0, 1)"),
    ):
        if not ok:  # a capacity of 0 divided demand by zero deep in the simulation (a traceback)
            raise _fail(f"{flag} must be {bound}, got {value:g}")
    try:
        source = TraceSource(trace, step, tz, trace_format)
        traffic = source.fetch()
        if head_days is not None:
            traffic = traffic.window(0, round(head_days * 86400 / traffic.step))
        y = demand(traffic, demand_unit)  # type: ignore[arg-type]
        cfg = BacktestConfig(
            warmup_s=warmup,
            capacity=capacity,
            headroom=headroom,
            test_fraction=test_fraction,
            models=[m.strip() for m in models.split(",") if m.strip()],
            budget_s=budget,
            level=level,
            down_cooldown_s=down_cooldown,
            upper_headroom=upper_headroom,
            band_window_s=band_window,
            band_scale=band_scale,
        )
        result = run_backtest(traffic, y, cfg, progress)
    except ForecasterError as exc:
        raise _fail(str(exc)) from None
    report = result.report
    typer.echo(
        f"{report['trace']}: {report['test']['buckets']} test buckets of {report['step_s']:g} s, "
        f"warm-up {warmup:g} s, capacity {capacity:g}/s per replica, headroom {headroom:g}"
    )
    _policy_table(report)
    _forecast_table(report)
    typer.echo(f"models chosen (origins): {report['models_chosen']}")
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2))
    if plot is not None:
        from forecaster.backtest.plot import plot_backtest

        plot_backtest(result, plot)


@app.command(
    help=(
        "Serve the published decision for KEDA's metrics-api scaler: GET /desired (desiredReplicas), "
        "/metrics, /health on PROMPTEDGE_ACTUATOR_PUBLISH_HOST:PUBLISH_PORT (default 127.0.0.1:8090), "
        "logging like every service (PROMPTEDGE_FORECASTER_LOG_FORMAT). "
        "Every setting with its env name and default: python -m forecaster settings."
    )
)
def desired() -> None:
    """Serve forecaster.actuate.publish's endpoint (blocking) with uvicorn's lines in the log format."""
    from forecaster.actuate.publish import serve_desired
    from forecaster.actuate.settings import ActuatorSettings

    try:
        settings = ActuatorSettings()
    except (ValidationError, SettingsError) as exc:
        raise _fail(_settings_error(exc)) from None
    serve_desired(settings)


@app.command(
    help=(
        "What-if report from advisory mode's record: what would have happened had the forecaster been in "
        "control (under-provisioned minutes, replica-minutes, GPU-hours, scale events) against what the "
        "cluster did, for PROMPTEDGE_ACTUATOR_NAMESPACE/DEPLOYMENT; demand from Prometheus when the source is "
        "Prometheus. Exit codes: 0 complete; 1 written, but something could not be known (it says what); "
        "2 bad input."
    )
)
def report(
    since: Annotated[str, typer.Option(help="Window ending now: 24h, 90m, 2d, 1w or seconds.")] = "24h",
    until: Annotated[
        float | None,
        typer.Option(help="Unix s the window ends at (default: the clock, PROMPTEDGE_FORECASTER_CLOCK_*)."),
    ] = None,
    gpus_per_replica: Annotated[float, typer.Option(help="GPUs one replica holds, for GPU-hours.")] = 1.0,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the report as JSON here.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write a PNG here.")] = None,
) -> None:
    """The what-if report (forecaster/advisory/report.py) as a table, JSON and PNG."""
    from forecaster.advisory.report import build_report, parse_span, render_text
    from forecaster.live import advisory_log, target_key

    if plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise _fail("--plot needs matplotlib: pip install 'promptedge[plot]'")
    if not (math.isfinite(gpus_per_replica) and gpus_per_replica > 0):  # NaN passes a "<= 0" test
        raise _fail(f"--gpus-per-replica must be a finite number > 0, got {gpus_per_replica:g}")
    if until is not None and not math.isfinite(until):
        raise _fail(f"--until must be a finite Unix time (s), got {until:g}")
    _check_outputs(("--json", json_path), ("--plot", plot))
    try:
        span = parse_span(since)
        settings = ForecasterSettings()
        actuator_settings = load_actuator_settings()
        if span > actuator_settings.advisory_retention_s:
            raise _fail(
                f"--since {since!r}: longer than the advisory record is kept "
                f"(PROMPTEDGE_ACTUATOR_ADVISORY_RETENTION_S = {actuator_settings.advisory_retention_s / 86400:g} days)"
            )
        notes: tuple[str, ...] = ()
        if not actuator_settings.deployment:
            notes = (
                f"PROMPTEDGE_ACTUATOR_DEPLOYMENT is not set: the target is {actuator_settings.target}, the record "
                "a forecaster without a Deployment writes; set it to the Deployment advisory mode watches",
            )
        end = settings.clock().now() if until is None else until
        result = build_report(
            settings,
            advisory_log(settings, actuator_settings),
            target_key(settings, actuator_settings),
            span,
            end,
            gpus_per_replica,
            notes,
        )
        text = render_text(result)
    except ForecasterError as exc:
        raise _fail(str(exc)) from None
    except RedisURLError as exc:
        raise _fail(f"settings: a Redis URL (PROMPTEDGE_REDIS_URL): {exc}") from None
    except (ValidationError, SettingsError) as exc:
        raise _fail(_settings_error(exc)) from None
    except (ArithmeticError, ValueError, TypeError, KeyError, IndexError, MemoryError) as exc:
        # Backstop, narrow on purpose: the report reads a record any process may have written and
        # an answer from any Prometheus, and the rule is never a traceback to a user. Bad input is
        # checked above and unreadable data becomes an unknown; a data error that still slips
        # through ends in one line (the traceback is logged at debug for a bug report). Errors
        # of the program's own wiring (ImportError, AttributeError, ...) still show a traceback.
        log.debug("report failed", exc_info=True)
        raise typer.Exit(_internal(f"the report could not be built: {type(exc).__name__}: {exc}")) from None
    typer.echo(text)
    try:
        if json_path is not None:
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(json.dumps(result.document, indent=2))
        if plot is not None:
            from forecaster.advisory.plot import plot_report

            plot_report(result, plot)
    except OSError as exc:  # checked first, but the disk can still fill or the folder go away
        raise _fail(f"writing the report: {exc}") from None
    raise typer.Exit(int(ExitCode.OK if result.complete else ExitCode.HOLD))


@app.command(
    "settings",
    help="List every setting: environment variable, default, and its key in the "
    "YAML file named by PROMPTEDGE_SETTINGS_FILE.",
)
def settings_command() -> None:
    """Print the forecaster's and the actuator's settings (opskit.settings_table)."""
    from forecaster.actuate.settings import ActuatorSettings

    typer.echo(settings_table((ForecasterSettings, ActuatorSettings)))


def main() -> None:
    """Entry point for ``python -m forecaster`` and ``promptedge-forecaster``: logs to stderr in
    PROMPTEDGE_FORECASTER_LOG_FORMAT (json or text; invalid settings are reported by the command)."""
    try:
        fmt = ForecasterSettings().log_format
    except (ValidationError, SettingsError):
        fmt = ForecasterSettings.model_fields["log_format"].default
    configure_logging(fmt, logging.INFO)
    app()
