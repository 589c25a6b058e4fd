"""The names in a run directory (run.yaml, metrics.jsonl, checkpoint-N, ...) and what kind of folder a path is:
a run, an adapter, a whole model, or one holding files that roctune's runs do not write."""
from __future__ import annotations

import os

RUN_FILE = "run.yaml"
METRICS_FILE = "metrics.jsonl"
LOSS_PLOT = "loss.png"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MODEL_CONFIG = "config.json"
CHECKPOINT_PREFIX = "checkpoint-"
CHECKPOINT_DONE = "trainer_state.json"
STATE_TENSORS = "training_state.safetensors"
STATE_JSON = "training_state.json"
BEST_DIR = "best"
BEST_STATE = "best.json"
TENSORBOARD_DIR = "tensorboard"
EVAL_DIR = "eval"
STATUS_FILE = "status.json"
COMPLETIONS_FILE = "completions.jsonl"  # GRPO's sampled completions (--completion-samples-steps)


def is_run_dir(path: str) -> bool:
    """A directory roctune's training wrote (it holds run.yaml)."""
    return os.path.isfile(os.path.join(path, RUN_FILE))


def has_adapter(path: str) -> bool:
    return os.path.isfile(os.path.join(path, ADAPTER_CONFIG))


def final_adapter_saved(path: str) -> bool:
    """The run's final save completed: the final save moves adapter_config.json in last (atomic.move_files_into's
    `last`), so a stop during the save leaves the folder without it, and --resume finishes the save."""
    return has_adapter(path) and os.path.isfile(os.path.join(path, ADAPTER_WEIGHTS))


def is_full_model_dir(path: str) -> bool:
    """A freeze/full run (or any model directory): config.json and weights, no adapter."""
    return os.path.isfile(os.path.join(path, MODEL_CONFIG)) and not has_adapter(path)


# What a run directory may hold: the files and folders train, eval and the trackers write there (and the
# tokenizer/model files save_pretrained writes). --overwrite replaces only a folder these names fully describe.
OWN_FILES = {RUN_FILE, METRICS_FILE, LOSS_PLOT, STATUS_FILE, COMPLETIONS_FILE, ADAPTER_CONFIG, ADAPTER_WEIGHTS,
             MODEL_CONFIG, "README.md", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
             "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
             "chat_template.json", "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
             "processor_config.json", "preprocessor_config.json"}  # the last two: a vision model's processor
OWN_DIRS = {BEST_DIR, TENSORBOARD_DIR, EVAL_DIR}


def foreign_entries(path: str) -> list[str]:
    """Entries of `path` that roctune's runs do not write (empty for a folder roctune's files fully describe)."""
    out = []
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        is_dir = os.path.isdir(full) and not os.path.islink(full)
        own = (name.startswith((".tmp-", ".old-")) or (not is_dir and name in OWN_FILES)
               or (not is_dir and name.startswith("model-") and name.endswith(".safetensors"))
               or (is_dir and (name in OWN_DIRS or (name.startswith(CHECKPOINT_PREFIX)
                                                    and name[len(CHECKPOINT_PREFIX):].isdigit()))))
        if not own:
            out.append(name + ("/" if is_dir else ""))
    return out


def tensorboard_dir(run_dir: str) -> str:
    return os.path.join(run_dir, TENSORBOARD_DIR)
