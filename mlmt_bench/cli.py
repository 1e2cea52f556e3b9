"""The ``mlmt-bench`` command line (Typer).

Module import stays cheap (``--help`` must answer fast): every command imports what it needs
inside its body.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import typer

from mlmt_bench.errors import UserError

app = typer.Typer(
    name="mlmt-bench",
    help="Benchmark and ablation suite for RL of LLM reasoning with textual feedback.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


class _State:
    quiet = False
    json = False
    debug = False
    #: set by :func:`main` (the console script) only: the process is this command's own, so `run` may
    #: apply the CPU pin once its spec is read, which can re-execute the process. Called in-process
    #: (a test's CliRunner, a library caller) the app never re-executes its host.
    owns_process = False


state = _State()


def _emit(result: Any, human: Callable[[], None] | None = None) -> None:
    """Print ``result`` as JSON in --json mode, else call ``human`` (unless --quiet)."""
    if state.json:
        sys.stdout.write(json.dumps(result, indent=2, default=str) + "\n")
    elif human is not None and not state.quiet:
        human()


def _echo(text: str) -> None:
    """``typer.echo`` of a line that may hold user text (a path, a name), control characters
    escaped (:func:`~mlmt_bench.io.bounded_input.printable`): no input writes to the terminal raw."""
    from mlmt_bench.io.bounded_input import printable

    typer.echo(printable(text))


def _user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """One line on stderr and exit code 2 for bad input, and for an error of the machine (a folder
    this user cannot write, a read-only mount, a full disk); the traceback only with --debug.

    The one place every ``error: ...`` line is written: its control characters and bidi overrides
    (from a spec, a name, a ``--set`` value) are escaped here, so no message can drive the terminal."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            if state.debug:
                raise
            _exit_with_error(str(exc))
        except OSError as exc:
            if state.debug or exc.errno not in _MACHINE_ERRNOS:
                raise
            _exit_with_error(_machine_error(exc))
        except KeyboardInterrupt:
            sys.stderr.write("interrupted\n")
            raise typer.Exit(130) from None

    return wrapper


def _exit_with_error(message: str) -> NoReturn:
    """``error: MESSAGE`` on one line (and as JSON with --json), then exit code 2."""
    from mlmt_bench.io.bounded_input import printable

    msg = printable(message.replace("\n", " "))
    if state.json:
        sys.stdout.write(json.dumps({"error": msg}) + "\n")
    sys.stderr.write(f"error: {msg}\n")
    raise typer.Exit(2) from None


# Errors of the machine rather than of the code, wherever they happen.
_MACHINE_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT)


def _machine_error(exc: OSError) -> str:
    """The message for an OSError in ``_MACHINE_ERRNOS``: the file, what went wrong and, for a
    permission, who the process runs as (a Docker bind mount that dockerd created belongs to root)."""
    where = f"{exc.filename}: " if exc.filename else ""
    what = (exc.strerror or os.strerror(exc.errno or 0)).lower()
    if exc.errno in (errno.EACCES, errno.EPERM) and hasattr(os, "getuid"):
        return (f"{where}{what} for this process (uid {os.getuid()}); make the folder writable by that user, "
                "or choose another path")
    return f"{where}{what}"


@app.callback()
def _root(
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only errors and final results."),
    json_out: bool = typer.Option(False, "--json", help="Machine-readable JSON on stdout."),
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors."),
) -> None:
    state.quiet, state.json, state.debug = quiet, json_out, debug


SetOption = typer.Option(None, "--set", "-s", metavar="FIELD=VALUE",
                         help="Override a spec field: --set train.steps=5 (repeatable).")


@app.command("list")
@_user_errors
def list_components(
    kind: str | None = typer.Argument(None, help="Only this kind: benchmark, verifier, model, backend, algorithm "
                                                    "(a plural works too)."),
    json_out: bool = typer.Option(False, "--json", help="Machine-readable JSON on stdout (as the global --json)."),
) -> None:
    """List registered components with their descriptions."""
    from mlmt_bench import registry

    kinds = registry.REGISTRIES
    if kind is not None:
        name = kind[:-1] if kind not in kinds and kind.endswith("s") and kind[:-1] in kinds else kind
        if name not in kinds:
            raise UserError(registry.unknown_message("kind", kind, list(kinds)))
        kinds = {name: kinds[name]}
    rows = [{"kind": k, "name": e.name, "description": e.description, "source": e.source}
            for k, reg in kinds.items() for e in reg.entries()]
    state.json = state.json or json_out

    def human() -> None:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        from mlmt_bench.io.bounded_input import printable

        table = Table(title="mlmt-bench components")
        for col in ("kind", "name", "description", "source"):
            table.add_column(col)
        for r in rows:  # descriptions hold text such as "pip install .[gpu]": not rich markup
            table.add_row(*(escape(printable(r[c])) for c in ("kind", "name", "description", "source")))
        Console().print(table)

    _emit(rows, human)


@app.command()
@_user_errors
def validate(
    spec: Path = typer.Argument(..., help="Run, experiment or sweep spec (YAML)."),
    overrides: list[str] | None = SetOption,
) -> None:
    """Check a spec (fields, types, registry names, algorithm parameters) without running it."""
    from mlmt_bench import spec as specs

    raw = specs.read_yaml(spec)
    if "space" in raw and "run" in raw:  # a sweep spec: its run spec, and each parameter's end points
        from mlmt_bench.sweep import grid_size, load_sweep

        sweep = load_sweep(spec, overrides or [])
        result: dict[str, Any] = {"spec": str(spec), "kind": "sweep", "name": sweep.spec.name,
                                  "run": str(sweep.run_path), "parameters": list(sweep.space), "valid": True}
        if sweep.spec.sampler == "grid":
            result["grid_points"] = grid_size(sweep)
        _emit(result, lambda: _echo(f"{spec}: valid sweep spec {result['name']!r} over "
                                    f"{', '.join(result['parameters'])} (run spec {result['run']})"))
        return
    loaded = specs.load_any(spec, overrides or [])
    from mlmt_bench import trackers

    if isinstance(loaded, tuple):
        exp, arms = loaded
        for arm in arms.values():  # the stores on other machines answer (the README's promise)
            trackers.reach(arm.tracking.report_to, arm.tracking.options, Path(arm.output_dir))
        result = {"spec": str(spec), "kind": "experiment", "name": exp.name, "arms": list(arms),
                  "seeds": exp.seeds, "valid": True}
    else:
        trackers.reach(loaded.tracking.report_to, loaded.tracking.options, Path(loaded.output_dir))
        result = {"spec": str(spec), "kind": "run", "name": loaded.name, "valid": True}
    _emit(result, lambda: _echo(f"{spec}: valid {result['kind']} spec {result['name']!r}"))


@app.command()
@_user_errors
def plan(
    spec: Path = typer.Argument(..., help="Run or experiment spec (YAML)."),
    overrides: list[str] | None = SetOption,
    device: str = typer.Option("auto", "--device", help="auto (this machine), cpu, h200, h100-80gb, a100-80gb, ..."),
    gpus: int = typer.Option(1, "--gpus", min=1, metavar="N",
                             help="Data-parallel processes (each gets its share of the problems)."),
    force: bool = typer.Option(False, "--force", help="Plan a spec even if it does not fit the device's memory."),
) -> None:
    """Parameters, tokens, FLOPs, peak memory and time of a run, estimated offline before it starts."""
    from mlmt_bench.plan import plan_spec, refusal, render

    result = plan_spec(spec, overrides or [], device=device, gpus=gpus)
    _emit(result, lambda: typer.echo(render(result)))
    why = refusal(result)
    if why is not None and not force:
        raise UserError(why)


RayOption = typer.Option(None, "--ray", metavar="ADDRESS", help="Run each run (sweeps: each trial) as a Ray task on "
                         "the cluster at ADDRESS (auto, host:6379, ray://host:10001); `ray` extra.")
RayGpusOption = typer.Option(0.0, "--ray-gpus", min=0.0, metavar="N", help="With --ray: GPUs each task takes "
                             "(default 0).")


@app.command()
@_user_errors
def run(
    spec: Path | None = typer.Argument(None, help="Run or experiment spec (YAML)."),
    overrides: list[str] | None = SetOption,
    resume: Path | None = typer.Option(None, "--resume", metavar="DIR", help="Continue a killed run from its last "
                                          "checkpoint (no SPEC), or, with an experiment SPEC, a killed experiment's "
                                          "directory."),
    workers: int = typer.Option(1, "--workers", "-j", metavar="N", help="Experiments: runs at once, one process each."),
    ray: str | None = RayOption,
    ray_gpus: float = RayGpusOption,
    restore: list[Path] | None = typer.Option(None, "--restore", metavar="REPORT", help="Experiments: first copy "
                                              "in the finished runs of this experiment that REPORT (published with "
                                              "report --raw) holds, and run only the rest."),
    publish: Path | None = typer.Option(None, "--publish", metavar="REPORT", help="Experiments: after every "
                                        "finished run, publish the experiment so far with its raw data into REPORT "
                                        "(as report EXP_DIR --out REPORT --raw), so a session that ends first loses "
                                        "no finished run."),
) -> None:
    """Train and evaluate a run spec (or every arm × seed of an experiment spec)."""
    from mlmt_bench.io.signals import sigterm_as_interrupt

    with sigterm_as_interrupt():  # `kill`, `docker stop`: the run is marked interrupted, as by Ctrl-C
        _run(spec, overrides, resume, workers, ray, ray_gpus, restore, publish)


def _run(spec: Path | None, overrides: list[str] | None, resume: Path | None, workers: int, ray: str | None,
         ray_gpus: float, restore: list[Path] | None, publish: Path | None = None) -> None:
    from mlmt_bench import runner, spec as specs

    loaded = specs.load_any(spec, overrides or []) if spec is not None else None
    if state.owns_process:
        _apply_cpu_pin(loaded, resume)
    if isinstance(loaded, tuple):
        from mlmt_bench import experiment

        result = experiment.run_experiment(*loaded, progress=not state.quiet, workers=workers, resume=resume,
                                           ray=ray, ray_gpus=ray_gpus, restore=restore, publish=publish)
    elif restore:
        raise UserError("--restore applies to experiment specs: it copies an experiment's finished runs in")
    elif publish is not None:
        raise UserError("--publish applies to experiment specs; publish a run with report RUN_DIR --out REPORT --raw")
    elif ray is not None:
        raise UserError("--ray applies to experiment specs (arms × seeds) and sweeps; a single run runs here")
    elif workers != 1:
        raise UserError("--workers applies to experiment specs (arms × seeds); a single run uses train.threads")
    elif resume is not None:
        if spec is not None or overrides:
            raise UserError("--resume RUN_DIR takes the spec from the run directory; give no SPEC or --set "
                            "(an experiment is resumed with its SPEC and --resume EXPERIMENT_DIR)")
        result = runner.resume_run(resume, progress=not state.quiet)
    elif loaded is None:
        raise UserError("give a SPEC file or --resume RUN_DIR")
    else:
        result = runner.run(loaded, progress=not state.quiet)
    _emit(result, (lambda: _experiment_summary(result)) if "comparison" in result
          else (lambda: _echo(f"run directory: {result['run_dir']}")))


def _experiment_summary(result: dict[str, Any]) -> None:
    """An experiment's closing lines: its arms in one table and where the comparison was written."""
    from mlmt_bench.io.bounded_input import printable
    from mlmt_bench.io.progress import print_table
    from mlmt_bench.report.formatting import closing_rows

    summary = result["comparison"]
    header, rows = closing_rows(summary)
    files = summary["files"]
    print_table(f"{summary.get('title') or 'experiment'}: final evaluation (* p < 0.05)", header,
                [[printable(c) for c in row] for row in rows],
                [printable(f"comparison: {files['comparison.md']}"), printable(f"page: {files['index.html']}")])
    _echo(f"run directory: {result['run_dir']}")


@app.command()
@_user_errors
def verify(
    verifier: str = typer.Argument(..., help="Verifier name (see `mlmt-bench list verifier`)."),
    input_path: Path = typer.Argument(..., metavar="IN.jsonl",
                                      help="Lines with a problem (or benchmark + id) and a response."),
    out: Path = typer.Option(..., "--out", "-o", help="Output JSONL: each input line plus its verdict."),
    workers: int | None = typer.Option(None, "--workers", "-j", metavar="N", help="Parallel workers (code verifier)."),
) -> None:
    """Score responses with a verifier, one JSON line in, one line with its verdict out.

    Each line of IN.jsonl (gzip allowed) is an object with a "response" and either a "problem" or a "benchmark" + "id".

    A "problem" has "id", "benchmark", "prompt", "answer" (the gold), "tests" and "setup" (code, run in the sandbox).

    Example: {"problem": {"id": "p1", "benchmark": "mine", "prompt": "1+1?", "answer": "2"}, "response": "#2"}

    Each output line is the input plus "verdict": {"reward", "correct", "extracted", "kind", "detail"}.
    """
    from mlmt_bench.verifiers.io import verify_file

    summary = verify_file(verifier, input_path, out, workers=workers)
    _emit(summary, lambda: typer.echo(
        f"{summary['n']} scored, {summary['correct']} correct, mean reward {summary['mean_reward']:.3f} -> {out}"))


@app.command()
@_user_errors
def base(
    spec: Path = typer.Argument(..., help="Run or experiment spec with a `base:` section."),
    overrides: list[str] | None = SetOption,
    out: Path | None = typer.Option(None, "--out", "-o", help="Also write bases.json and bases.md (the table of "
                                       "checks) into this directory."),
) -> None:
    """Build (or find in the cache) the shared base of every arm and seed, and show its check."""
    from mlmt_bench import runner

    if out is not None:
        from mlmt_bench.tracking import check_output_dir

        check_output_dir(out, "--out")
    result = runner.bases_from_spec(spec, overrides or [], progress=not state.quiet)
    if out is not None:
        from mlmt_bench.report.bases import write_bases

        command = " ".join(["mlmt-bench base", str(spec), *(f"--set {o}" for o in overrides or []), "--out", str(out)])
        write_bases(result, out, command)

    def human() -> None:
        from mlmt_bench.report.bases import critic_line
        from mlmt_bench.warmstart.shared_base import check_line, gate_line

        for b in result:
            c = b.get("check") or {}
            typer.echo(f"base {b['key']} ({b['preset']}, seed {b['seed']}, {b['params']:,} parameters, "
                       f"{b['tokens']:,} tokens): {check_line(c)}  {b['path']}")
            for label, part in (("greedy", c), (f"T={(c.get('sampled') or {}).get('temperature')}", c.get("sampled"))):
                line = critic_line(part or {})
                if line:
                    typer.echo(f"  critic, {label}: {line}")
            for label, d in (("greedy", (b.get("gate") or {}).get("greedy")),
                             ("sampled", (b.get("gate") or {}).get("sampled"))):
                if d:
                    typer.echo(f"  critic gate, {gate_line(label, d)}")
            verdict = "INVALID testbed: " + "; ".join(b["invalid_because"]) if b["invalid_because"] else "valid testbed"
            typer.echo(f"  {verdict}")

    _emit(result, human)
    runner.refuse_invalid_bases(result)


@app.command()
@_user_errors
def report(
    runs: list[Path] | None = typer.Argument(None, metavar="DIR...", help="Run directories or experiment directories "
                                                        "(with experiment.json)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Directory for comparison.md, acc_vs_tokens.png and "
                                       "index.html (default: re-render the one experiment or report directory given, "
                                       "in place)."),
    baseline: str | None = typer.Option(None, "--baseline", help="Arm the others are tested against (default: the "
                                           "one a published report recorded, else grpo)."),
    arm: list[str] | None = typer.Option(None, "--arm", metavar="NAME=RUN_DIR",
                                         help="Name a run explicitly: NAME=RUN_DIR (repeatable)."),
    sweep: str | None = typer.Option(None, "--sweep", metavar="STORAGE", help="Report on an Optuna sweep instead: "
                                        "its storage URL or SQLite .db file (history, importances, best spec)."),
    study: str | None = typer.Option(None, "--study", help="With --sweep: the study, if the storage holds several."),
    at_flops: float | None = typer.Option(None, "--at-flops", metavar="FLOPS", help="Compare every run at its "
                                             "evaluation nearest this many FLOPs within ±10%, e.g. 3e11 (equal FLOPs "
                                             "from runs with a token budget); a run with none there is read below "
                                             "it and flagged, and a budget no run has one near is refused."),
    raw: bool = typer.Option(False, "--raw", help="Publish: copy each run's manifest, resolved spec, metrics, "
                             "per-problem outcomes and the episodes the page shows (gzip) into OUT/runs/ with an "
                             "experiment.json relative to OUT, then report on the copies; `mlmt-bench report OUT` "
                             "re-renders it byte for byte."),
) -> None:
    """Compare runs: final metrics with 95% bootstrap CIs, McNemar tests, accuracy vs tokens (or, \
with --sweep, a sweep's history, importances and best spec)."""
    if out is not None:  # a directory or a new path: never a file, a device or under /proc
        from mlmt_bench.tracking import check_output_dir

        check_output_dir(out, "--out")
    if sweep is not None:
        from mlmt_bench.report.sweep_report import report_sweep

        if runs or arm or at_flops is not None or raw or baseline is not None:
            raise UserError("--sweep reports on a study: give no run directories, --arm, --at-flops, --raw or "
                            "--baseline with it")
        if out is None:
            raise UserError("--sweep needs --out DIR")
        found = report_sweep(sweep, out, study)
        _emit(found, lambda: typer.echo(f"wrote {', '.join(found['files'].values())}"))
        return
    if study is not None:
        raise UserError("--study goes with --sweep STORAGE")
    if at_flops is not None and not 0 <= at_flops < float("inf"):
        raise UserError(f"--at-flops must be a number of FLOPs ≥ 0 (e.g. 3e11), got {at_flops:g}")
    if not runs:
        raise UserError("give run directories (or --sweep STORAGE)")
    from mlmt_bench.report.compare import report_from_dirs

    named: dict[str, list[Path]] = {}
    for a in arm or []:
        name, sep, path = a.partition("=")
        if not sep or not name or not path:
            raise UserError(f"--arm {a}: expected NAME=RUN_DIR")
        named.setdefault(name, []).append(Path(path))
    summary = report_from_dirs(list(runs), out, baseline, arms=named, at_flops=at_flops, raw=raw)

    def human() -> None:
        from mlmt_bench.io.notes import warn
        from mlmt_bench.report.formatting import untrained_at_budget

        typer.echo(f"wrote {', '.join(summary['files'].values())}")
        untrained = untrained_at_budget(summary) if summary.get("at_flops") is not None else []
        if untrained:
            warn(f"{', '.join(untrained)}: no evaluation after step 0 within {summary['at_flops']:.3g} FLOPs, so the "
                 "report shows them UNTRAINED (their starting point); compare at a larger --at-flops")
        size = summary.get("published")
        if size:
            typer.echo(f"published with the runs' raw data: {size['bytes'] / 1e6:.1f} MB in all"
                       + (f" (over the {size['limit_bytes'] / 1e6:.0f} MB a committed report should stay under)"
                          if size["over_limit"] else ""))

    _emit(summary, human)


@app.command()
@_user_errors
def size(
    runs: list[Path] = typer.Argument(..., metavar="DIR...", help="The pilot: run, experiment or published report "
                                      "directories."),
    arm: str = typer.Option(..., "--arm", help="The row whose difference is sized (e.g. mlmt)."),
    baseline: str = typer.Option("grpo", "--baseline", help="The row it is compared with (e.g. 'grpo + base "
                                 "critic')."),
    target: float = typer.Option(3.0, "--target", help="The MDE to reach, in points of acc@t2."),
    problems: list[int] | None = typer.Option(None, "--problems", help="Problem counts to project to (repeatable; "
                                              "default: the pilot's)."),
    hours: float | None = typer.Option(None, "--hours", help="A budget of wall hours on the pilot's machine for "
                                       "the contrast's arms: the design with the smallest MDE within it."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Also write sizing.md and sizing.json here."),
) -> None:
    """Size a headline from a pilot: the seed, problem and cell variance of ARM − BASELINE in final \
acc@t2, the MDE projected to other numbers of seeds and problems with their wall hours, and the fewest \
seeds that reach --target."""
    from mlmt_bench.report.sizing import render_markdown, size_from_dirs
    from mlmt_bench.tracking import atomic_write_text, check_output_dir

    if out is not None:
        check_output_dir(out, "--out")
    rec = size_from_dirs(list(runs), arm, baseline, target, problems, hours)
    text = render_markdown(rec)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "sizing.md", text)
        atomic_write_text(out / "sizing.json", json.dumps(rec, indent=2, sort_keys=True) + "\n")
    _emit(rec, lambda: typer.echo(text, nl=False))


@app.command("export")
@_user_errors
def export(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="A run directory."),
    role: str = typer.Option(..., "--role", help="solver or critic."),
    out: Path = typer.Option(..., "--out", "-o", help="New (or empty) directory to write."),
    merge: bool = typer.Option(False, "--merge", help="LoRA: merge the adapter into its base (full weights)."),
    step: int | None = typer.Option(None, "--step", min=0, metavar="N", help="checkpoints/step-N (default: the "
                                    "newest intact one, as `eval` picks)."),
) -> None:
    """Export a role's checkpoint as a Hub-ready directory with a model card (mlmt_bench/export.py)."""
    from mlmt_bench.export import export_run

    summary = export_run(run_dir, role, out, merge=merge, step=step)
    _emit(summary, lambda: typer.echo(f"wrote {summary['out']} ({summary['role']}, step {summary['step']}, "
                                      f"{summary['library_name']}, base {summary['base']})"))


@app.command("eval")
@_user_errors
def eval_(
    path: Path = typer.Argument(..., metavar="MODEL", help="HF or peft checkpoint dir, checkpoint step dir, or run dir "
                                "(its latest checkpoint)."),
    tasks: str = typer.Option(..., "--tasks", "-t", help="Comma-separated lm-eval task names."),
    include_path: Path | None = typer.Option(None, "--include-path", help="Folder of extra task YAML files "
                                                "(local data: dataset_path: json)."),
    policy: str = typer.Option("solver", "--policy", help="Policy of a checkpoint step or run dir: solver or critic."),
    limit: float | None = typer.Option(None, "--limit", help="Examples per task (a fraction if < 1)."),
    num_fewshot: int | None = typer.Option(None, "--num-fewshot", min=0, metavar="N",
                                           help="Few-shot examples (task default)."),
    batch_size: str = typer.Option("8", "--batch-size", help="Batch size, or 'auto'."),
    device: str | None = typer.Option(None, "--device", help="cpu, cuda, cuda:1 ... (default: cuda if available)."),
    backend: str = typer.Option("hf", "--backend", help="Harness model: hf or vllm."),
    chat_template: bool = typer.Option(False, "--apply-chat-template/--no-chat-template",
                                       help="Render prompts with the model's chat template."),
    seed: int = typer.Option(0, "--seed", help="Seed of the harness's samplers."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write the results (and the harness config) as JSON; "
                                    "lm-eval's own results_<time>.json beside it, as its --output_path writes it."),
    model_args: str | None = typer.Option(None, "--model-args", help="lm-eval's model_args (key=value,...), over "
                                          "the checkpoint's (e.g. dtype=float32)."),
    gen_kwargs: str | None = typer.Option(None, "--gen-kwargs", help="lm-eval's gen_kwargs (key=value,...), e.g. "
                                          "temperature=0,max_gen_toks=256."),
    log_samples: bool = typer.Option(False, "--log-samples", help="Write lm-eval's samples_<task>_<time>.jsonl "
                                     "beside --out."),
) -> None:
    """Evaluate a checkpoint with EleutherAI's lm-evaluation-harness (the `eval` extra)."""
    from mlmt_bench.external_eval import run_lm_eval

    if limit is not None and limit <= 0:
        raise UserError(f"--limit must be > 0 (a count, or a fraction below 1), got {limit:g}")
    lim: int | float | None = None if limit is None else (int(limit) if limit >= 1 else limit)
    bs: int | str = int(batch_size) if batch_size.isdigit() else batch_size
    summary = run_lm_eval(path, [t.strip() for t in tasks.split(",") if t.strip()], policy=policy,
                          include_path=include_path, limit=lim, num_fewshot=num_fewshot, batch_size=bs,
                          device=device, backend=backend, apply_chat_template=chat_template, seed=seed, out=out,
                          model_args=model_args, gen_kwargs=gen_kwargs, log_samples=log_samples)

    def human() -> None:
        typer.echo(f"model: {summary['model']}")
        for task, metrics in summary["tasks"].items():
            shown = ", ".join(f"{k} {v:.4g}" for k, v in metrics.items() if not k.endswith("_stderr")
                              and "_stderr," not in k and k != "sample_len")
            typer.echo(f"  {task} (n={summary['n_samples'].get(task, '?')}): {shown}")
        if out:
            typer.echo(f"wrote {out}, {', '.join([summary['lm_eval_results'], *summary['lm_eval_samples']])}")

    _emit(summary, human)


@app.command()
@_user_errors
def sweep(
    spec: Path = typer.Argument(..., metavar="SWEEP.yaml", help="Sweep spec (YAML): a run spec and a search space."),
    n_trials: int | None = typer.Option(None, "--n-trials", "-n", min=1, metavar="N",
                                           help="Complete + pruned trials in total (default: the spec's n_trials)."),
    storage: str | None = typer.Option(None, "--storage", help="Optuna storage URL (default: SQLite in the sweep's "
                                          "output dir); postgresql+psycopg2://... to share a study between machines."),
    study: str | None = typer.Option(None, "--study", help="Study name (default: the sweep's name)."),
    seed: int | None = typer.Option(None, "--seed", help="Sampler seed (default: random)."),
    workers: int = typer.Option(1, "--workers", "-j", min=1, metavar="N", help="Trial processes on this machine, "
                                "all on the same study (SQLite: a few; PostgreSQL: also across machines)."),
    ray: str | None = RayOption,
    ray_gpus: float = RayGpusOption,
    heartbeat: int | None = typer.Option(None, "--heartbeat", min=1, metavar="SECONDS", help="Seconds between a "
                                            "running trial's heartbeats (default: 60); a trial silent for 3 "
                                            "heartbeats (its process died) is failed and retried once."),
    overrides: list[str] | None = SetOption,
) -> None:
    """Tune a run spec with Optuna; running the same command again resumes the study.

    Writes <output_dir>/<name>/ (output_dir of the run spec, name of the sweep): the study <name>.db, \
trials/ with one run directory per trial, and <study>-best.yaml, the run spec with the best parameters. \
--set applies to the run spec.
    """
    from mlmt_bench.sweep import run_sweep
    from mlmt_bench.sweep.display import print_summary

    result = run_sweep(spec, n_trials=n_trials, storage=storage, study_name=study, seed=seed,
                       overrides=overrides or [], progress=not state.quiet, workers=workers, heartbeat_s=heartbeat,
                       ray=ray, ray_gpus=ray_gpus)
    _emit(result, lambda: print_summary(result))
    if result.get("stopped"):
        from mlmt_bench.io.bounded_input import printable

        sys.stderr.write(f"error: sweep stopped: {printable(str(result['stopped']))}\n")
        raise typer.Exit(1)


probe_app = typer.Typer(help="Probes of a spec's policies: what the refinement reads.", no_args_is_help=True)
app.add_typer(probe_app, name="probe")


@probe_app.command("feedback")
@_user_errors
def probe_feedback(
    spec: Path = typer.Argument(..., metavar="SPEC|RUN_DIR", help="Run spec (YAML) whose solver and critic are "
                                "probed at step 0, or a run directory (its newest checkpoint: a finished run's "
                                "final policies)."),
    split: str = typer.Option("test", "--split", help="Split of the spec's benchmark: test or validation."),
    limit: int | None = typer.Option(None, "--limit", "-n", min=1, metavar="N", help="Only the first N problems."),
    redact: bool | None = typer.Option(None, "--redact/--no-redact", help="Redact every row's feedback before the "
                                       "refiner sees it (default: the spec's feedback.redact)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Also write probe.json and probe.md here "
                                    "(refused where they exist)."),
    overrides: list[str] | None = SetOption,
) -> None:
    """The feedback perturbation probe (METHOD v4): identical attempts refined after the critic's own
    feedback and after edits of it (values removed, last value shifted, approve-all with gold or own
    values, the oracle's, g∅); acc@t2 and the share of refinements that copy a value of the feedback."""
    from mlmt_bench import runner, spec as specs
    from mlmt_bench.io.progress import print_table
    from mlmt_bench.probe import table_rows, write_probe

    _check_record_dir(out, "probe.json", "probe.md")
    if spec.is_dir():
        if overrides:
            raise UserError("--set applies to a SPEC; a run directory is probed with its own spec")
        result = runner.probe_from_run_dir(spec, split=split, limit=limit, redact=redact, progress=not state.quiet)
    else:
        loaded = specs.load_any(spec, overrides or [])
        if isinstance(loaded, tuple):
            raise UserError(f"{spec}: an experiment spec; the probe takes a run spec (one of its arms) or a run "
                            "directory")
        result = runner.probe_from_spec(loaded, split=split, limit=limit, redact=redact, progress=not state.quiet)
    result["command"] = " ".join(["mlmt-bench probe feedback", str(spec), "--split", split,
                                  *(["--limit", str(limit)] if limit else []),
                                  *([] if redact is None else ["--redact" if redact else "--no-redact"]),
                                  *(f"--set {o}" for o in overrides or [])])
    files = write_probe(result, out) if out is not None else []

    def human() -> None:
        header, rows = table_rows(result)
        print_table(f"feedback probe: {result['spec']} (seed {result['seed']}"
                    f"{', step ' + str(result['step']) if 'step' in result else ''}), {result['n']} {split} problems, "
                    f"acc@t1 {100 * result['acc@t1']:.1f}%{', redacted' if result['redact'] else ''}", header, rows,
                    [f"wrote {f}" for f in files])

    _emit({k: v for k, v in result.items() if k != "per_problem"}, human)


def _check_record_dir(out: Path | None, *names: str) -> None:
    """A probe's ``--out``, checked before the probe spends minutes: a one-line error if unusable,
    or if it holds a record ``names`` would overwrite (an earlier probe's: never lost)."""
    if out is not None:
        from mlmt_bench.tracking import check_output_dir

        check_output_dir(out, "--out")
        taken = [n for n in names if (out / n).exists()]
        if taken:
            raise UserError(f"--out {out}: it already holds {', '.join(taken)} (an earlier probe's record); "
                            f"give another --out or move it away")


def _write_record(result: dict[str, Any], out: Path | None, name: str) -> list[Path]:
    """A probe's whole record as ``out/name`` (JSON, written atomically); the paths written."""
    if out is None:
        return []
    from mlmt_bench.tracking import atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / name, json.dumps(result, indent=2, default=str) + "\n")
    return [out / name]


@probe_app.command("critic")
@_user_errors
def probe_critic(
    spec: Path = typer.Argument(..., help="Run spec (YAML) whose starting solver and critic are checked."),
    split: str = typer.Option("validation", "--split", help="Split of the spec's benchmark: validation or test."),
    limit: int = typer.Option(200, "--limit", "-n", min=1, metavar="N", help="The first N problems."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Also write gate.json (the whole record) here "
                                    "(refused where it exists)."),
    overrides: list[str] | None = SetOption,
) -> None:
    """The critic gate (METHOD v4) on a spec's starting policies: the solver's own attempts judged by
    the critic, greedy and at the training temperatures; detection J = recall - false alarms must
    reach 0.20 with false alarms at most 10%. Exit 0 whether it passes or not; the line says."""
    from mlmt_bench import runner, spec as specs
    from mlmt_bench.warmstart.shared_base import gate_line

    _check_record_dir(out, "gate.json")
    loaded = specs.load_any(spec, overrides or [])
    if isinstance(loaded, tuple):
        raise UserError(f"{spec}: an experiment spec; the gate takes a run spec (one of its arms)")
    result = runner.critic_gate_from_spec(loaded, split=split, limit=limit, progress=not state.quiet)
    result["command"] = " ".join(["mlmt-bench probe critic", str(spec), "--split", split, "--limit", str(limit),
                                  *(f"--set {o}" for o in overrides or [])])
    files = _write_record(result, out, "gate.json")

    def human() -> None:
        typer.echo(f"critic gate: {result['spec']} (seed {result['seed']}), {result['critic']} critic on the "
                   f"solver's own attempts, {result['n']} {split} problems, {result['seconds']:.0f} s")
        for label in ("greedy", "sampled"):
            typer.echo("  " + gate_line(label, result[label]))
        typer.echo("  passes" if not result["failures"] else "  FAILS: " + "; ".join(result["failures"]))
        for f in files:
            _echo(f"wrote {f}")

    _emit(result, human)


@probe_app.command("value")
@_user_errors
def probe_value(
    spec: Path = typer.Argument(..., help="Run spec (YAML) whose starting solver and critic roll out."),
    rows: int = typer.Option(4096, "--rows", min=2, help="Rollouts to fit on (METHOD v4: at least 4,000)."),
    steps: int = typer.Option(1000, "--steps", min=1, help="Adam steps of each fit."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Also write value.json (the whole record) here "
                                    "(refused where it exists)."),
    overrides: list[str] | None = SetOption,
) -> None:
    """The value probe (METHOD v4, "Value gate"): the learned value fitted on rollouts of the
    spec's starting policies (training problems, training temperatures), its held-out explained
    variance (80/20 by problem) with the v3 features (last token) and the v4 ones (+ the feedback
    pooled)."""
    from mlmt_bench import runner, spec as specs
    from mlmt_bench.warmstart.value_probe import MIN_ROWS

    _check_record_dir(out, "value.json")
    loaded = specs.load_any(spec, overrides or [])
    if isinstance(loaded, tuple):
        raise UserError(f"{spec}: an experiment spec; the probe takes a run spec (one of its arms)")
    result = runner.value_probe_from_spec(loaded, rows=rows, steps=steps, progress=not state.quiet)
    result["command"] = " ".join(["mlmt-bench probe value", str(spec), "--rows", str(rows), "--steps", str(steps),
                                  *(f"--set {o}" for o in overrides or [])])
    files = _write_record(result, out, "value.json")

    def human() -> None:
        def ev(v: Any) -> str:
            return "–" if v is None else f"{v:+.3f}"

        typer.echo(f"value probe: {result['spec']} (seed {result['seed']}), {result['rows']:,} rollouts on "
                   f"{result['problems']} training problems, mean r2 {result['r2_mean']:.3f}, "
                   f"{result['seconds']:.0f} s" + ("" if result["rows"] >= MIN_ROWS
                                                   else f" (fewer than METHOD v4's {MIN_ROWS:,})"))
        for name, r in result["features"].items():
            typer.echo(f"  {name} ({r['width']} features): held-out explained variance {ev(r['explained_variance'])} "
                       f"on {r['n_test']} rows (fitted on {r['n_train']}: {ev(r['train_ev'])})")
        for f in files:
            _echo(f"wrote {f}")

    _emit(result, human)


def _apply_cpu_pin(loaded: Any, resume: Path | None) -> None:
    """The CPU pin for ``run`` (:mod:`mlmt_bench.machine.reproducible`), once the spec says what the runs
    build: on when some run makes weights from a seed (a tiny model, the shared base), off
    (recorded, with its reason) when every model loads pretrained weights from a checkpoint. A
    resumed run keeps what its manifest recorded; a run that cannot be read is pinned."""
    from mlmt_bench import runner
    from mlmt_bench.machine import reproducible

    why_not = "every model of this run loads pretrained weights from a checkpoint"
    if loaded is None and resume is not None:
        try:
            env = json.loads((resume / "manifest.json").read_text()).get("environment") or {}
        except (OSError, ValueError, AttributeError):
            env = {}
        skipped = str(env.get("unpinned_because") or "")
        if skipped.startswith("not needed: "):
            return reproducible.apply(needed=False, why_not=skipped.removeprefix("not needed: "))
        return reproducible.apply()
    runs = list(loaded[1].values()) if isinstance(loaded, tuple) else [loaded] if loaded is not None else []
    need = [runner.needs_cpu_pin(r) for r in runs]
    if not runs or any(need):
        if any(runner.pretrained_roles(r) for r in runs) and reproducible.enabled():
            from mlmt_bench.io.notes import note

            note("the CPU pin is on (a model of this run is made from a seed: a tiny model or the shared base), "
                 "pretrained models included: their generation runs slower (measured 1.7-2.4x)")
        return reproducible.apply()
    return reproducible.apply(needed=False, why_not=why_not if len(runs) == 1 else why_not.replace(
        "of this run", "of these runs"))


#: Commands that apply the CPU pin once their spec is read (:func:`_apply_cpu_pin`); every other
#: command applies it first thing.
_PIN_AFTER_SPEC = ("run",)


def _command(argv: list[str]) -> str | None:
    """The command name of a command line (the first argument that is not an option)."""
    return next((a for a in argv if not a.startswith("-")), None)


def main() -> None:
    from mlmt_bench.machine import cpus, reproducible

    cpus.passive_wait_when_busy()  # before torch loads: no spinning OpenMP waits on a busy machine
    if _command(sys.argv[1:]) not in _PIN_AFTER_SPEC:
        reproducible.apply()  # before anything loads torch: the same float results on every machine of a CPU vendor
    state.owns_process = True
    app()


if __name__ == "__main__":
    main()
