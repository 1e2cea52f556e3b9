"""``mlmt-bench export RUN_DIR --role solver|critic [--merge] [--step N] --out DIR``: one role's
checkpoint of a run as a directory the Hugging Face Hub takes as it is (``huggingface-cli upload``,
``push_to_hub``), with a model card.

The checkpoint is the one ``mlmt-bench eval`` picks (:func:`mlmt_bench.external_eval.resolve_checkpoint`:
the newest whose trainer state is at the step its name says), or ``checkpoints/step-N`` with ``--step``.
What DIR holds:

- a full fine-tuned role: the checkpoint's HF directory (config, safetensors, tokenizer), for
  ``AutoModelForCausalLM.from_pretrained(DIR)``;
- a LoRA role: the peft adapter directory, for ``AutoPeftModelForCausalLM.from_pretrained(DIR)``.
  Its ``base_model_name_or_path`` is the base's hub name when the run loaded the base from the hub;
  any other base (a local directory, the tiny shared base, a shipped alias, whose dequantized
  weights are not the hub's) exists on this machine only, so its files are copied into ``DIR/base/``
  and the adapter names that copy by its absolute path: DIR loads without the run directory or the
  cache, on this machine; after moving or uploading DIR, point ``base_model_name_or_path`` at the
  copy's new place (or export with ``--merge``). The card says which was done;
- with ``--merge``: the adapter merged into the base (``merge_and_unload``), full weights + the
  tokenizer, for ``AutoModelForCausalLM.from_pretrained(DIR)``;

plus ``spec.resolved.yaml`` (the run's spec, verbatim) and ``README.md``, the model card: YAML front
matter (``library_name``, ``base_model`` where the base has a hub name, ``tags``) and what was
trained, on what, the final metrics, the base's name (never a local path) and the mlmt-bench version
and commit. DIR is written under a temporary name and renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mlmt_bench.errors import UserError

ROLES = ("solver", "critic")
#: the files of a model directory that are copied (weights, configs, tokenizer, chat template);
#: peft's own stub README.md is replaced by the card
_MODEL_FILES = ("*.json", "*.safetensors", "*.jinja", "*.txt", "*.model")
_ROLE_TEXT = {"solver": "the solver (it answers the problems)",
              "critic": "the critic (it writes feedback on the solver's answers)"}


@dataclass(frozen=True)
class BaseName:
    """The base a role started from, as a card names it. ``name``: a hub name, or a short label
    (never a local path); ``hub``: the hub name when the base has one (the card's ``base_model``);
    ``local``: the weights the run used exist on this machine only; ``note``: one sentence or ''."""

    name: str
    hub: str | None
    local: bool
    note: str = ""


def base_name(path: str | None, manifest: dict[str, Any]) -> BaseName:
    """How the card names a role's base, from the role's spec ``path`` (None: the run's shared
    tiny base, named by the manifest's ``base.key``) and the run's manifest."""
    from mlmt_bench.models import hub, pretrained

    if path is None:
        key = (manifest.get("base") or {}).get("key") if isinstance(manifest.get("base"), dict) else None
        return BaseName(f"mlmt-bench shared base {key}" if key else "mlmt-bench shared base", None, True,
                        "built by `mlmt-bench base`; not on the hub")
    shipped = pretrained.lookup(path)
    if shipped is not None:
        return BaseName(shipped.hub, shipped.hub, True,
                        f"the shipped alias `{shipped.alias}`: {shipped.origin}, not the hub's own weights")
    if hub.looks_local(path) or Path(path).expanduser().exists():
        return BaseName(f"{Path(path).expanduser().name} (a local checkpoint)", None, True, "not on the hub")
    return BaseName(path, path, False)


def _fail_out(out: Path) -> None:
    from mlmt_bench.tracking import check_output_root

    check_output_root(out, "--out")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out}: exists and is not an empty directory; give a new one")


def _checkpoint_dir(run: Path, role_dir_name: str, step: int | None) -> Path:
    """The role's model directory of the checkpoint ``step`` (or the one ``eval`` picks)."""
    from mlmt_bench.external_eval import resolve_checkpoint
    from mlmt_bench.io.checkpoint_state import recorded_step

    if step is None:
        return resolve_checkpoint(run, role_dir_name)
    step_dir = run / "checkpoints" / f"step-{step:06d}"
    if not (step_dir / role_dir_name).is_dir():
        have = sorted(p.name for p in (run / "checkpoints").glob("step-*") if (p / role_dir_name).is_dir())
        raise UserError(f"--step {step}: {run} has no {step_dir.name}/{role_dir_name} checkpoint"
                        + (f" (it has {', '.join(have[-3:])})" if have else " (it has none)"))
    if recorded_step(step_dir) != step:
        raise UserError(f"{step_dir}: its trainer state is not at step {step}; refused")
    return step_dir / role_dir_name


def _copy_model_files(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for pattern in _MODEL_FILES:
        for f in sorted(src.glob(pattern)):
            if f.is_file():
                shutil.copyfile(f, dst / f.name)


def _final_metrics(run: Path) -> dict[str, Any]:
    """The run's ``final`` row of metrics.jsonl (else its last ``eval`` row; {} for none)."""
    from mlmt_bench.io.bounded_input import jsonl_bounds
    from mlmt_bench.io.jsonl import iter_jsonl

    path = run / "metrics.jsonl"
    if not path.is_file():
        return {}
    final: dict[str, Any] = {}
    for _, row in iter_jsonl(path, torn_tail_ok=True, **jsonl_bounds()):
        if isinstance(row, dict) and row.get("kind") in ("final", "eval") and (row["kind"] == "final"
                                                                              or final.get("kind") != "final"):
            final = row
    return final


def export_run(run_path: Path | str, role: str, out: Path | str, *, merge: bool = False,
               step: int | None = None) -> dict[str, Any]:
    """Write ``role``'s checkpoint of the run at ``run_path`` to ``out`` (see the module docstring);
    returns ``{"out", "role", "step", "checkpoint", "library_name", "merged", "base", "base_copied"}``."""
    from mlmt_bench.models.model_dir_check import check_model_dir
    from mlmt_bench.spec import load_run_spec
    from mlmt_bench.tracking import RunDir

    if role not in ROLES:
        raise UserError(f"--role {role!r}: expected solver or critic")
    out = Path(out)
    _fail_out(out)
    run_dir = RunDir.open(run_path)
    run_dir.check_spec()  # the card describes the spec the run trained with
    run = run_dir.path
    manifest = run_dir.manifest()
    mode = ((manifest.get("roles") or {}).get(role) if isinstance(manifest.get("roles"), dict) else None)
    if mode == "absent":
        raise UserError(f"{run}: the run has no {role} (manifest roles.{role}: absent)")
    spec = load_run_spec(run / "spec.resolved.yaml")
    pspec = getattr(spec.policies, role) if mode != "shared" else spec.policies.solver
    if pspec is None:
        raise UserError(f"{run}: the run's spec has no policies.{role}")
    stored_as = "solver" if mode == "shared" else role  # one model playing both roles is saved once, as solver
    ckpt = _checkpoint_dir(run, stored_as, step)
    check_model_dir(ckpt)  # before anything is loaded or copied: safetensors only, configs that fit
    is_lora = (ckpt / "adapter_config.json").is_file()
    base = base_name(pspec.path, manifest)
    ckpt_step = int(ckpt.parent.name[5:])

    final = out.resolve()
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    base_copied = False
    try:
        if is_lora and merge:
            _write_merged(role, pspec, ckpt, tmp)
        else:
            _copy_model_files(ckpt, tmp)
            if is_lora:
                base_copied = _point_adapter_at_base(tmp, final, base)
        shutil.copyfile(run / "spec.resolved.yaml", tmp / "spec.resolved.yaml")
        library = "peft" if is_lora and not merge else "transformers"
        card = model_card(spec=spec, manifest=manifest, role=role, step=ckpt_step, base=base, library=library,
                          merged=is_lora and merge, base_copied=base_copied, metrics=_final_metrics(run))
        (tmp / "README.md").write_text(card, encoding="utf-8")
        if final.exists():
            final.rmdir()  # empty (checked above)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"out": str(out), "role": role, "step": ckpt_step, "checkpoint": str(ckpt), "library_name": library,
            "merged": is_lora and merge, "base": base.name, "base_copied": base_copied}


def _write_merged(role: str, pspec: Any, ckpt: Path, tmp: Path) -> None:
    """The run's policy rebuilt as a resume does (its spec's dtype and LoRA, the checkpoint's
    weights, checked to fit), its adapter merged into the base, saved with its tokenizer."""
    from mlmt_bench.io.bounded_input import read_json
    from mlmt_bench.models.hf_quiet import quiet_transformers
    from mlmt_bench.models.policy import build_policy

    init_path = read_json(ckpt / "adapter_config.json")["base_model_name_or_path"]  # checked by check_model_dir
    policy = build_policy(role, pspec, init_path)
    policy.check_weights_fit(ckpt)
    policy.load_weights(ckpt)
    merged = policy.model.merge_and_unload()
    merged.name_or_path = ""  # not the local path it was loaded from
    with quiet_transformers():
        merged.save_pretrained(tmp)
        policy.tokenizer.save_pretrained(tmp)


def _point_adapter_at_base(tmp: Path, final: Path, base: BaseName) -> bool:
    """Set the exported adapter's ``base_model_name_or_path``: the hub name, or (a base on this
    machine only) a copy of the base in ``final/base``. Returns whether the base was copied."""
    from mlmt_bench.io.bounded_input import read_json

    config = read_json(tmp / "adapter_config.json")
    if base.local:
        _copy_model_files(Path(config["base_model_name_or_path"]).expanduser(), tmp / "base")
        config["base_model_name_or_path"] = str(final / "base")
    else:
        config["base_model_name_or_path"] = base.hub
    (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return base.local


def model_card(*, spec: Any, manifest: dict[str, Any], role: str, step: int, base: BaseName, library: str,
               merged: bool, base_copied: bool, metrics: dict[str, Any]) -> str:
    """The README.md of an export: YAML front matter and a Markdown body (pure: no file is read)."""
    import mlmt_bench

    algo = spec.algorithm.name
    variant = spec.algorithm.params.get("variant")
    front: dict[str, Any] = {"library_name": library}
    if base.hub:  # the hub checks that base_model names a hub model; a local-only base has no such name
        front["base_model"] = base.hub
    front["pipeline_tag"] = "text-generation"
    front["tags"] = ["mlmt-bench", "reinforcement-learning", algo, spec.benchmark.name, role]
    if library == "peft":
        front["tags"] += ["lora", f"base_model:adapter:{base.hub}"] if base.hub else ["lora"]
    lines = ["---", yaml.safe_dump(front, sort_keys=False).rstrip(), "---", "",
             f"# {spec.name}: {role}", "",
             f"{_ROLE_TEXT[role].capitalize()}, trained with **{algo}**"
             + (f" (variant `{variant}`)" if variant else "") + f" on the **{spec.benchmark.name}** benchmark by "
             f"mlmt-bench; the checkpoint of step {step} of "
             f"{spec.train.steps}.", ""]
    what = ("the LoRA adapter merged into its base: full weights and the tokenizer "
            "(`AutoModelForCausalLM.from_pretrained(dir)`)" if merged else
            "a peft LoRA adapter and the tokenizer (`AutoPeftModelForCausalLM.from_pretrained(dir)`)"
            if library == "peft" else "full fine-tuned weights and the tokenizer "
            "(`AutoModelForCausalLM.from_pretrained(dir)`)")
    lines += ["## Base model", "", f"- base: **{base.name}**" + (f" ({base.note})" if base.note else ""),
              f"- this directory: {what}"]
    if base_copied:
        lines.append("- the base exists on the training machine only, so its files are copied into `base/`, and "
                     "`adapter_config.json`'s `base_model_name_or_path` names that copy by its absolute path at "
                     "export time: after moving or uploading this directory, set it to the copy's new place "
                     "(e.g. a hub repository of `base/`), or export with `--merge`")
    elif library == "peft":
        lines.append(f"- `adapter_config.json`'s `base_model_name_or_path` is the hub name `{base.hub}`")
    lines += ["", "## Final metrics", ""]
    shown = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if shown:
        lines += [f"From the run's `metrics.jsonl` (its `{metrics.get('kind')}` record; acc@t1: first attempt "
                  "accuracy, acc@t2: after feedback and refinement).", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {v:.6g} |" for k, v in shown.items()]
    else:
        lines.append("The run logged no evaluation.")
    git = manifest.get("git_sha")
    versions = manifest.get("versions")
    versions = versions if isinstance(versions, dict) else {}
    lines += ["", "## Training", "",
              f"- algorithm: `{algo}`; role: `{role}`; benchmark: `{spec.benchmark.name}`; seed {spec.seed}; "
              f"{spec.train.steps} steps",
              "- the run's full spec, with every default filled in: `spec.resolved.yaml` in this directory "
              "(`mlmt-bench run spec.resolved.yaml` reproduces the run; its paths are the training machine's)",
              f"- mlmt-bench version {versions.get('mlmt-bench', mlmt_bench.__version__)}"
              + (f", commit `{git}`" if git else ", commit unknown (not run from a git checkout)"),
              ""]
    return "\n".join(lines)
