"""Recipes: what to learn, as short files that read top to bottom, on the shared engine (roctune.training), one
per stage (roctune.stages: its row names the recipe, the data it reads and what it learns from). `train(cfg)`
runs the recipe cfg.stage names (its row in roctune.stages); `prepare(cfg)` checks every input before anything loads
or is written, with the recipe's own `check_inputs(cfg, records)` where it has one."""
from __future__ import annotations

import logging

from roctune.stages import STAGES

log = logging.getLogger(__name__)


def prepare(cfg, check_output: bool = True):
    """Validate everything that can be wrong before any file is written or model loaded.
    Returns (records, eval_records, base_model_path). `check_output` is off where another process owns the
    output directory (the other ranks of a multi-process run, the other nodes' launchers)."""
    from roctune import methods, rundir
    from roctune.models import resolve_model
    from roctune.training import trackers

    cfg.validate()
    trackers.check(cfg.report_to)  # a missing tracker package is reported before the data is read
    if cfg.streaming:
        from roctune.data.records import StreamedRecords as read  # checked and counted now, read again to tokenize
    else:
        read = STAGES[cfg.stage].load_reader()  # conversations, pairs, prompts or documents (roctune.stages)
    records = read(cfg.data)
    eval_records = read(cfg.eval_data) if cfg.eval_data else []
    check_inputs = getattr(STAGES[cfg.stage].load_recipe(), "check_inputs", None)
    if check_inputs:  # the stage's own checks before the model loads (grpo: its rewards), in its recipe file
        check_inputs(cfg, records + eval_records)
    base_model = resolve_model(methods.start_model_name(cfg))
    from roctune import vision

    vision.check_records([records, eval_records], base_model)  # images need a model with a vision tower
    methods.check(cfg, base_model)  # method, adapter, module names, bitsandbytes, vision flags: before anything loads
    if cfg.rope_scaling:  # a model whose rope is already scaled is refused here, from its config
        from roctune.models import scaled_config

        scaled_config(base_model, cfg.rope_scaling, cfg.trust_remote_code)
    if cfg.sequence_parallel > 1:  # the model's heads and attention, from its config.json
        from roctune.memory.configs import load_config
        from roctune.training import sequence_parallel

        sequence_parallel.check(cfg, load_config(base_model))
    if check_output:
        rundir.check_new_output(cfg.output, cfg.resume, cfg.overwrite)
        if cfg.resume:
            check_resume(cfg)
    return records, eval_records, base_model


def _same(name: str, given, recorded) -> bool:
    import os

    if given == recorded:
        return True
    if name in ("model", "adapter", "data"):  # the same files, spelled differently
        pair = [given if isinstance(given, list) else [given], recorded if isinstance(recorded, list) else [recorded]]
        if all(isinstance(x, str) for part in pair for x in part) and len(pair[0]) == len(pair[1]):
            return all(os.path.realpath(a) == os.path.realpath(b) for a, b in zip(*pair))
    return False


def check_resume(cfg) -> None:
    """--resume with settings that define a different run (another model, rank or data) is refused, naming the
    flag, both values and the fix; the run's files stay as they are."""
    from roctune import rundir
    from roctune.config.sections import RESUME_FIXED  # the settings whose declaration says resume_fixed
    from roctune.errors import ConfigError

    recorded = rundir.read_run(cfg.output).get("config") or {}
    for name in RESUME_FIXED:
        if name in recorded and not _same(name, getattr(cfg, name), recorded[name]):
            flag, given, was = "--" + name.replace("_", "-"), getattr(cfg, name), recorded[name]
            shown = " ".join(map(str, was)) if isinstance(was, list) else was
            raise ConfigError(f"--resume: {flag} is {'(default)' if given is None else repr(given)} here but "
                              f"{was!r} in the run ({cfg.output}/{rundir.RUN_FILE}); a resumed run continues the "
                              f"same training: give {flag} {shown} as the run did, or start a new run (another "
                              "--output, or --overwrite)")


def train(cfg, log=log.info, progress: bool = True) -> dict:
    """Run one training job with the recipe of cfg.stage. Returns a summary dict (final loss, steps, tokens/s,
    output dir). The first process claims the output folder for the run (rundir.claim: its lock; with --overwrite a
    staging folder that replaces the old run only once complete); the others write nothing there themselves."""
    from roctune import rundir
    from roctune.training.launch import env_rank

    main = env_rank() == 0
    records, eval_records, base_model = prepare(cfg, check_output=main)
    recipe = STAGES[cfg.stage].load_recipe()
    target = cfg.output
    if not main:
        if rundir.replaces_run(target, cfg.resume, cfg.overwrite):
            cfg.output = rundir.staging_path(target)
        try:
            return recipe.run(cfg, records, eval_records, base_model, log, progress)
        finally:
            cfg.output = target
    with rundir.claim(target, cfg.resume, cfg.overwrite) as folder:
        if folder != target:
            log(f"--overwrite: building the new run in {folder}; it replaces {target} only once complete")
        cfg.output = folder
        try:
            with rundir.status.running(folder) as end:  # status.json: starting ... done, failed or stopped
                summary = recipe.run(cfg, records, eval_records, base_model, log, progress)
                end["step"] = summary.get("steps")
        finally:
            cfg.output = target
    if folder != target:
        log(f"--overwrite: the new run replaced the previous one in {target}")
    return {**summary, "output": target}
