"""Recipes: what to learn, as short files that read top to bottom, on the shared engine (roctune.training).
`sft` learns the answers of conversations; `dpo` prefers chosen over rejected answers. `train(cfg)` runs the
recipe cfg.stage names; `prepare(cfg)` checks every input before anything loads or is written."""
from __future__ import annotations

import logging

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
    if cfg.stage == "dpo":
        from roctune.data.preference import load_pairs as read  # preference pairs instead of conversations
    elif cfg.streaming:
        from roctune.data.records import StreamedRecords as read  # checked and counted now, read again to tokenize
    else:
        from roctune.data.records import load_records as read
    records = read(cfg.data)
    eval_records = read(cfg.eval_data) if cfg.eval_data else []
    base_model = resolve_model(methods.start_model_name(cfg))
    methods.check(cfg, base_model)  # method, adapter, module names, bitsandbytes: before anything loads
    if check_output:
        rundir.check_new_output(cfg.output, cfg.resume, cfg.overwrite)
    return records, eval_records, base_model


def train(cfg, log=log.info, progress: bool = True) -> dict:
    """Run one training job with the recipe of cfg.stage. Returns a summary dict (final loss, steps, tokens/s,
    output dir)."""
    from roctune.training.launch import env_rank

    records, eval_records, base_model = prepare(cfg, check_output=env_rank() == 0)
    if cfg.stage == "dpo":
        from roctune.recipes import dpo as recipe
    else:
        from roctune.recipes import sft as recipe
    return recipe.run(cfg, records, eval_records, base_model, log, progress)
