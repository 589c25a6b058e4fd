"""The run directory's format, and its only owner: every command that reads or writes a run goes through here.

A run directory (`roctune train --output DIR`) holds:
- `run.yaml`: the resolved settings, the base model's path, the device/dtype/attention choices and data counts;
- `metrics.jsonl`: one JSON object per logged optimizer step (step, loss, lr, tokens/s, eval loss, ...);
- the final model: a PEFT adapter (`adapter_model.safetensors`, `adapter_config.json`) for lora/qlora, or a whole
  model (`config.json` + weights) for freeze/full; the tokenizer; `loss.png`;
- `checkpoint-N/` while training with --save-steps: the trainable weights, `training_state.safetensors` (optimizer
  tensors, RNG states), `training_state.json` (everything else) and `trainer_state.json` (written last: a
  checkpoint without it is incomplete and ignored);
- `best/` with --early-stopping-patience or --load-best: the trainable weights of the evaluation with the lowest
  eval loss so far, loadable as an adapter (`best.json` says which step and loss);
- `tensorboard/` with --report-to tensorboard: the event files (same steps and values as metrics.jsonl);
- `eval/` after `roctune eval` (its default --output): report.html, report.md, predictions.jsonl, eval.json;
- `status.json`: what the trainer is doing now (phase, step of total, ETA, the last metrics row, its pid), rewritten
  atomically as it goes and ending in done, failed or stopped. Readers (the web UI, scripts) take a run's state
  from it (`read_status`, `run_state`) instead of from log lines, whose wording may change.

Checkpoints never hold pickles: tensors go to safetensors and plain data to JSON, so loading one cannot run code.
Checkpoints written by release 0.1 (`optimizer.pt`, `rng.pt`) still load, through `torch.load(weights_only=True)`,
which refuses anything but tensors and plain containers.

Every file is written under a temporary name and renamed into place, so an interrupted write never leaves a
half-written file where a finished one is expected.

One module per job; this package re-exports their public names, so `rundir.X` reads the same from every caller:
- layout: the file and folder names above, and what kind of folder a path is (run, adapter, whole model);
- atomic: temporary-name-and-rename writes of files and folders, and removing what a killed writer left;
- output: whether a command may write where it was told (a new run, --resume, --overwrite, an output file);
- lock: claiming an output folder for one run (its lock, and the staging folder of --overwrite);
- run_yaml: run.yaml and what later commands read from it; adapter: checks of a LoRA adapter's files;
- run: `open(path) -> Run`, a run read and checked once for every command that uses it (merge, export, eval,
  generate, chat, serve, train --adapter), with its method's and stage's rows;
- metrics: metrics.jsonl and loss.png; status: status.json, a run's state, and running() that keeps it for a run;
- checkpoints: checkpoint-N/ and best/; tensors: the training state as safetensors + JSON.
"""
from __future__ import annotations

from roctune.rundir.adapter import adapter_settings, check_adapter, check_lora_fields, check_safetensors
from roctune.rundir.atomic import (atomic_path, atomic_write_text, move_files_into, new_file_mode, pid_alive,
                                   remove_leftovers, remove_stale_temps, write_dir_atomically)
from roctune.rundir.checkpoints import (best_dir, checkpoint_dir, list_checkpoints, load_checkpoint, read_best,
                                        save_best, save_checkpoint)
from roctune.rundir.layout import (ADAPTER_CONFIG, ADAPTER_WEIGHTS, BEST_DIR, BEST_STATE, CHECKPOINT_DONE,
                                   CHECKPOINT_PREFIX, COMPLETIONS_FILE, EVAL_DIR, LOSS_PLOT, METRICS_FILE, MODEL_CONFIG,
                                   OWN_DIRS, OWN_FILES, RUN_FILE, STATE_JSON, STATE_TENSORS, STATUS_FILE,
                                   TENSORBOARD_DIR, final_adapter_saved, foreign_entries, has_adapter, is_full_model_dir, is_run_dir,
                                   tensorboard_dir)
from roctune.rundir.lock import (STAGING_PREFIX, claim, lock_path, locked, remove_staging, replaces_run,
                                 staging_path)
from roctune.rundir.metrics import append_metrics, json_line, metrics_path, plot_loss, read_metrics, reset_metrics
from roctune.rundir.output import (LOG_ONLY_FILES, check_new_output, check_output_file, check_writable_parent,
                                   clear_unsaved_run, is_unsaved_ended_run)
from roctune.rundir.run import Run, open_run as open, refuse_scorer  # noqa: A004 - rundir.open(path) -> Run
from roctune.rundir.run_yaml import (base_model, method, read_run, rope_scaling, template_name, tool_format,
                                     total_steps, write_run)
from roctune.rundir.status import (ACTIVE_PHASES, END_PHASES, RUN_STATES, read_status, run_state, status_path,
                                   summary, write_status)
from roctune.rundir.tensors import join_tensors, read_state, split_tensors, write_state
