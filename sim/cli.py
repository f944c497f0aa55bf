"""Typer CLI of the sim package: serve, replay, demo, sample."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(
    help="Simulated vLLM replicas, trace replay and the local demo stack.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def main() -> None:
    """Simulated vLLM replicas, trace replay and the local demo stack."""


@app.command(
    help="Run one simulated vLLM replica (OpenAI API, /health, vLLM /metrics); drains on SIGTERM. "
    "Every setting with its env name and default: python -m sim settings."
)
def serve(
    port: Annotated[int | None, typer.Option(help="TCP port (env PROMPTEDGE_SIM_PORT).")] = None,
    model: Annotated[str | None, typer.Option(help="Served model name.")] = None,
    profile: Annotated[str | None, typer.Option(help="GPU profile: a100 or t4.")] = None,
    warmup_s: Annotated[float | None, typer.Option("--warmup-s", help="Seconds of 503 on /health after start.")] = None,
    host: Annotated[str | None, typer.Option(help="Bind address.")] = None,
    fail_rate: Annotated[float | None, typer.Option(help="Fraction of completions answered 500.")] = None,
    hang: Annotated[
        bool, typer.Option("--hang", help="Completions are held until the fault is cleared (fault test).")
    ] = False,
    max_model_len: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Most tokens (prompt + max_tokens) of one request; longer ones get a 400, as in vLLM "
            "(default: the profile's, a100 32768, t4 8192).",
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            help="As vLLM's --api-key: /v1 routes need 'Authorization: Bearer KEY' (env PROMPTEDGE_SIM_API_KEY)."
        ),
    ] = None,
    time_scale: Annotated[
        float | None,
        typer.Option(
            "--time-scale",
            help="Simulated seconds per wall second: step times, warm-up and sleeps are divided by it; "
            "metrics stay in simulated seconds (env PROMPTEDGE_SIM_TIME_SCALE, default 1).",
        ),
    ] = None,
    enable_prefix_caching: Annotated[
        bool | None,
        typer.Option(
            "--enable-prefix-caching/--no-enable-prefix-caching",
            help="vLLM's automatic prefix caching: cached prompt blocks are not prefilled again (default on).",
        ),
    ] = None,
    block_size: Annotated[
        int | None, typer.Option(min=1, max=256, help="Tokens per KV-cache block, as vLLM's --block-size (default 16).")
    ] = None,
) -> None:
    """Run one simulated vLLM replica (OpenAI API, /health, vLLM /metrics); drains on SIGTERM."""
    from sim.replica.serving import ReplicaConfigError, build_replica, serve_replica

    overrides = {
        k: v
        for k, v in dict(
            port=port,
            model=model,
            profile=profile,
            warmup_s=warmup_s,
            host=host,
            fail_rate=fail_rate,
            max_model_len=max_model_len,
            api_key=api_key,
            time_scale=time_scale,
            enable_prefix_caching=enable_prefix_caching,
            block_size=block_size,
        ).items()
        if v is not None
    }
    if hang:
        overrides["hang"] = True
    try:
        app_, settings = build_replica(overrides)
    except ReplicaConfigError as exc:
        if exc.param is not None:
            raise typer.BadParameter(str(exc), param_hint=exc.param) from None
        raise _fail(str(exc)) from None
    serve_replica(app_, settings)


@app.command(
    "settings",
    help="List every setting of a replica (sim serve) and of the stand-in node (sim node): "
    "environment variable, default, and its key in the YAML settings file.",
)
def settings_command() -> None:
    """Print SimSettings and NodeSettings (opskit.settings_table)."""
    from opskit import settings_table
    from sim.node.settings import NodeSettings
    from sim.replica.settings import SimSettings

    typer.echo(settings_table((SimSettings, NodeSettings)))


def run() -> None:
    """Entry point of the ``promptedge-sim`` console script (the same CLI as ``python -m sim``)."""
    app(prog_name="promptedge-sim")


def _fail(message: str) -> typer.Exit:
    typer.secho(f"error: {message}", fg="red", err=True)
    return typer.Exit(2)


def check_output_path(option: str, path: Path | None) -> None:
    """Refuse, before a long run, an output file that could not be written at its end: its
    folder is made now (as the writer would) and must be writable, and the path must not be a
    folder. Prints the error naming ``option`` and ``path`` and raises typer.Exit(2); None: nothing
    to check (opskit.output_path_error). Also used by bench/closed_loop.py."""
    from opskit import output_path_error

    error = output_path_error(option, path)
    if error is not None:
        raise _fail(error)


@app.command()
def node(
    kubeconfig: Annotated[
        str | None, typer.Option(help="Kubeconfig file (default: KUBECONFIG or ~/.kube/config).")
    ] = None,
    context: Annotated[str | None, typer.Option(help="Kubeconfig context (default: its current one).")] = None,
    name: Annotated[str | None, typer.Option(help="Node name (default sim-gpu-0).")] = None,
    gpus: Annotated[int | None, typer.Option(help="nvidia.com/gpu capacity (default 8).")] = None,
    ip_base: Annotated[
        str | None, typer.Option(help="Three loopback octets for Pod IPs, e.g. 127.0.1 (default).")
    ] = None,
    time_scale: Annotated[float | None, typer.Option(help="Simulated seconds per wall second (default 1).")] = None,
    profile: Annotated[
        str | None, typer.Option(help="GPU profile when a Pod's annotation names none (default a100).")
    ] = None,
    warmup: Annotated[
        str | None,
        typer.Option(
            help="Warm-up when a Pod's annotation names none: seconds or vllm-8b-cold / vllm-8b-cached (default 0)."
        ),
    ] = None,
    log_dir: Annotated[Path | None, typer.Option(help="Keep replica logs here (default: a temporary folder).")] = None,
    spares: Annotated[
        int | None,
        typer.Option(
            help="Replica processes kept pre-started, imports done, so a Pod's "
            "replica starts at once (default 2, at most 16)."
        ),
    ] = None,
) -> None:
    """Play a Kubernetes node: run each Pod bound to it as a simulated vLLM replica."""
    from kubernetes.config import ConfigException
    from pydantic import ValidationError

    from sim.node import NodeSettings, run_node
    from sim.node.status import IpPool

    overrides = {
        k: v
        for k, v in dict(
            kubeconfig=kubeconfig,
            context=context,
            name=name,
            gpus=gpus,
            ip_base=ip_base,
            time_scale=time_scale,
            profile=profile,
            warmup=warmup,
            log_dir=log_dir,
            spares=spares,
        ).items()
        if v is not None
    }
    try:
        settings = NodeSettings(**overrides)
        IpPool(settings.ip_base)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise _fail(f"invalid node settings: {problems}") from None
    except ValueError as exc:
        raise _fail(str(exc)) from None
    try:
        run_node(settings)
    except ConfigException as exc:
        raise _fail(f"no usable kubeconfig: {exc}") from None


@app.command()
def replay(
    target: Annotated[str, typer.Option(help="Base URL of an OpenAI-compatible endpoint.")],
    trace: Annotated[
        Path | None, typer.Option(help="Azure CSV or Mooncake JSONL trace (default: synthetic sample).")
    ] = None,
    questions: Annotated[
        Path | None, typer.Option(help="Question pairs: QQP .tar.gz or .json (default: synthetic sample).")
    ] = None,
    speedup: Annotated[float, typer.Option(help="Time compression: trace seconds per wall second.")] = 60.0,
    duration: Annotated[
        float | None, typer.Option(help="Wall seconds of arrivals to replay (default: whole trace).")
    ] = None,
    model: Annotated[str, typer.Option(help="Model name sent in requests.")] = "sim-llama-8b",
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the report as JSON here.")] = None,
    concurrency: Annotated[int, typer.Option(help="Most requests in flight.")] = 256,
    sample_fraction: Annotated[float, typer.Option(help="Keep each trace request with this probability.")] = 1.0,
    pad_context: Annotated[
        bool, typer.Option("--pad-context", help="Pad prompts to the trace's context tokens.")
    ] = False,
    shared_prefixes: Annotated[
        bool,
        typer.Option(
            "--shared-prefixes", help="Mooncake rows: prompts built from their hash_ids blocks (equal ids, equal text)."
        ),
    ] = False,
    max_context_tokens: Annotated[
        int, typer.Option(min=1, help="Cap of a padded or shared-prefix prompt (tokens).")
    ] = 6000,
    no_stream: Annotated[bool, typer.Option("--no-stream", help="Non-stream requests (no TTFT).")] = False,
    seed: Annotated[int, typer.Option(help="Seed of the prompt mix and sampling.")] = 0,
) -> None:
    """Replay a trace against an OpenAI-compatible endpoint and report latency, TTFT, hits."""
    from sim.client.questions import MixConfig, QuestionsFormatError
    from sim.client.replay import ReplayConfig
    from sim.client.report import render
    from sim.client.traces import TraceFormatError
    from sim.client.workload import build_plan, load_inputs, replay_report, write_json

    try:
        cfg = ReplayConfig(
            target=target,
            model=model,
            speedup=speedup,
            duration_s=duration,
            concurrency=concurrency,
            sample_fraction=sample_fraction,
            pad_context=pad_context,
            shared_prefixes=shared_prefixes,
            max_context_tokens=max_context_tokens,
            stream=not no_stream,
            seed=seed,
        )
        plan = build_plan(*load_inputs(trace, questions), cfg, MixConfig(seed=seed))
    except (TraceFormatError, QuestionsFormatError, ValueError) as exc:
        raise _fail(str(exc)) from None
    report = replay_report(plan, cfg)
    if json_path:  # first: the text below must never cost the replay's report
        write_json(report, json_path)
    typer.echo(render(report))


@app.command()
def sample(
    dest: Annotated[Path | None, typer.Option(help="Folder (default: the package's sim/samples).")] = None,
) -> None:
    """Regenerate the synthetic sample trace and question pairs (not real traffic)."""
    from sim.client.sample import SAMPLES_DIR, write_samples

    for path in write_samples(dest or SAMPLES_DIR):
        typer.echo(f"wrote {path}")


@app.command()
def demo(
    trace: Annotated[
        Path | None, typer.Option(help="Azure CSV or Mooncake JSONL trace (default: synthetic sample).")
    ] = None,
    questions: Annotated[
        Path | None, typer.Option(help="Question pairs: QQP .tar.gz or .json (default: synthetic sample).")
    ] = None,
    speedup: Annotated[float, typer.Option(help="Time compression: trace seconds per wall second.")] = 60.0,
    duration: Annotated[float, typer.Option(help="Wall seconds of trace arrivals to replay.")] = 60.0,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the report as JSON here.")] = None,
    max_token_rate: Annotated[
        float, typer.Option(help="Thin the trace to at most this many generated tokens per wall second (0: no limit).")
    ] = 4500.0,
    log_dir: Annotated[Path, typer.Option(help="Folder for the processes' logs.")] = Path("out/demo-logs"),
    replica_capacity: Annotated[
        float, typer.Option(help="Requests per wall second one replica serves (forecaster capacity).")
    ] = 15.0,
) -> None:
    """Start Redis, three simulated replicas and the router; replay; forecast; stop; report."""
    from sim.client.questions import QuestionsFormatError
    from sim.client.traces import TraceFormatError
    from sim.client.workload import write_json
    from sim.demo.report import render
    from sim.demo.run import DemoConfig, run_demo
    from sim.stack.processes import StackError

    cfg = DemoConfig(
        trace=trace,
        questions=questions,
        speedup=speedup,
        duration_s=duration,
        max_token_rate=max_token_rate,
        log_dir=log_dir,
        replica_capacity_rps=replica_capacity,
    )
    try:
        report = run_demo(cfg)
    except (TraceFormatError, QuestionsFormatError, ValueError) as exc:
        raise _fail(str(exc)) from None
    except StackError as exc:
        raise _fail(f"{exc}\n(logs in {log_dir})") from None
    except KeyboardInterrupt:
        typer.secho("interrupted: all demo processes stopped", fg="yellow", err=True)
        raise typer.Exit(130) from None
    if json_path:  # first: the text below must never cost the run's report
        write_json(report, json_path)
    typer.echo(render(report))
    if json_path:
        typer.echo(f"report written to {json_path}")


def warming_fields(mode: str, sets: list[str]) -> dict[str, Any] | None:
    """``LoopConfig.warming`` of ``--warming`` and ``--warming-set KEY=VALUE`` (each VALUE JSON,
    else taken as a string). Raises ValueError on a mode other than on/off, a KEY=VALUE without
    ``=``, or settings given with warming off."""
    if mode not in ("on", "off"):
        raise ValueError(f"--warming must be 'on' or 'off', got {mode!r}")
    fields: dict[str, Any] = {}
    for item in sets:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--warming-set wants KEY=VALUE, got {item!r}")
        try:
            fields[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            fields[key.strip()] = raw
    if mode == "off":
        if fields:
            raise ValueError("--warming-set needs --warming on")
        return None
    return fields


@app.command()
def loop(
    trace: Annotated[Path, typer.Option(help="ServeGen folder or timestamp,value CSV (NAB) of per-window rates.")],
    start_hour: Annotated[
        float | None,
        typer.Option(
            help="Segment start, hours from the trace start (default: the steepest ramp after the history days)."
        ),
    ] = None,
    max_jump: Annotated[
        float,
        typer.Option(
            help="Default segment: the steepest ramp whose total rate rises at most this factor per window; 0: any rise, a step included."
        ),
    ] = 1.35,
    hours: Annotated[float, typer.Option(help="Segment length, hours.")] = 1.0,
    speedup: Annotated[float, typer.Option(help="Simulated seconds per wall second, in every process.")] = 7.0,
    warmup_s: Annotated[float, typer.Option("--warmup-s", help="Replica cold start, simulated seconds.")] = 300.0,
    policies: Annotated[
        str, typer.Option(help="Comma-separated: predictive,reactive,fixed_peak,fixed_mean.")
    ] = "predictive,reactive,fixed_peak,fixed_mean",
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the report as JSON here.")] = None,
    plot_path: Annotated[Path | None, typer.Option("--plot", help="Write the PNG here.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of arrivals, tokens and prompts (the same for every policy).")] = 0,
    profile: Annotated[
        str, typer.Option(help="Replica GPU profile (Pod annotation promptedge.io/sim-profile).")
    ] = "l4",
    capacity_rps: Annotated[
        float | None,
        typer.Option(help="Requests/s one replica serves within the SLO (default: measured on the latency model)."),
    ] = None,
    peak_replicas: Annotated[
        int, typer.Option(help="Replicas the segment's busiest window needs (rescales volume).")
    ] = 5,
    max_replicas: Annotated[int, typer.Option(help="Upper bound of both autoscalers.")] = 8,
    history_days: Annotated[float, typer.Option(help="Days before the segment written as router counters.")] = 7.0,
    history: Annotated[
        str, typer.Option(help="History minutes: 'sampled' counts (bursty, as live) or 'expected' rates.")
    ] = "sampled",
    questions: Annotated[
        Path | None,
        typer.Option(
            help="Question pairs (QQP .tar.gz or .json; default: the QQP archive in ../shared/data when present, else the synthetic sample)."
        ),
    ] = None,
    log_dir: Annotated[Path, typer.Option(help="Folder for logs of every process.")] = Path("out/loop"),
    warming: Annotated[
        str,
        typer.Option(
            help="Predictive cache warming in the router: 'off' (default) or 'on' (needs the forecaster: predictive policy)."
        ),
    ] = "off",
    warming_set: Annotated[
        list[str] | None,
        typer.Option(
            help="A warming setting KEY=VALUE (JSON value), e.g. min_rise=0.1; repeatable; with --warming on."
        ),
    ] = None,
) -> None:
    """Closed loop on a real control plane: each policy in turn on the same traffic; table, JSON, PNG."""
    from sim.client.questions import QuestionsFormatError
    from sim.client.traces import TraceFormatError
    from sim.client.traffic import TrafficFormatError
    from sim.loop import LoopConfig, plot, render, run_loop, write_json
    from sim.loop.world import ToolsMissing
    from sim.stack.processes import StackError

    check_output_path("--json", json_path)
    check_output_path("--plot", plot_path)
    try:
        cfg = LoopConfig(
            trace=trace,
            start_hour=start_hour,
            max_jump=max_jump or None,
            hours=hours,
            speedup=speedup,
            warmup_s=warmup_s,
            policies=tuple(p.strip() for p in policies.split(",") if p.strip()),
            json_path=json_path,
            plot_path=plot_path,
            seed=seed,
            profile=profile,
            capacity_rps=capacity_rps,
            peak_replicas=peak_replicas,
            max_replicas=max_replicas,
            history_days=history_days,
            history=history,
            questions=questions,
            log_dir=log_dir,
            warming=warming_fields(warming, warming_set or []),
        )
        report = run_loop(cfg)
    except (TraceFormatError, QuestionsFormatError, TrafficFormatError, ValueError, KeyError) as exc:
        # a KeyError's str() is its message in quotes
        raise _fail(str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)) from None
    except ToolsMissing as exc:  # before anything started: no logs
        raise _fail(str(exc)) from None
    except StackError as exc:
        raise _fail(f"{exc}\n(logs in {log_dir})") from None
    except RuntimeError as exc:  # WorldError: the control plane or a manifest
        raise _fail(f"{exc}\n(logs in {log_dir})") from None
    except KeyboardInterrupt:
        typer.secho("interrupted: every loop process stopped", fg="yellow", err=True)
        raise typer.Exit(130) from None
    typer.echo(render(report))
    if json_path:
        write_json(report, json_path)
        typer.echo(f"report written to {json_path}")
    if plot_path:
        plot(report, plot_path)
        typer.echo(f"plot written to {plot_path}")
    if any(p.get("invalid") for p in report["policies"].values()):
        raise typer.Exit(1)  # the table says which run and why
