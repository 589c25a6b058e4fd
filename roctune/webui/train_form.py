"""The Train panel's form, generated from the settings declared in roctune.config: one component per setting
(choices: dropdown, several for a list, bools: checkbox, numbers: number box with the declared bounds, lists and text: text box;
datasets, base model and adapter: dropdowns of the workspace's files, models and runs),
and the way back from the form's values to a checked TrainConfig. The checks are the CLI's own
(`TrainConfig.validate`, `rundir.check_new_output`), so the page shows the exact line `roctune train` prints."""
from __future__ import annotations

from typing import Any

FORM_GROUPS = ("data", "model", "training", "lora", "rl", "hardware", "run", "processes")
# never on the page: a reward file, a tools file and an environment class are Python code that would run on the
# page's machine; like --trust-remote-code for a model they are the user's decision at the command line (roctune
# train --reward-file / --tools / --environment).
# Nor the settings of several machines: each node runs its own `roctune train` (the page's processes are this
# machine's: --nproc, --fsdp, --sequence-parallel)
PAGE_NEVER = ("reward_file", "tools", "environment", "nnodes", "node_rank", "master_addr", "master_port",
              "rendezvous_timeout")
OPEN_GROUPS = ("data", "model", "training", "lora")
REPEAT_LISTS = ("data", "eval_data")  # one path per line
PATH_FIELDS = ("output", "adapter")   # resolved inside the workspace (data lists and the model too)
ESTIMATE_FIELDS = ("model", "method", "lora_r", "lora_dropout", "target_modules", "batch_size", "grad_accum",
                   "max_length", "attn", "dtype", "device", "grad_checkpointing", "freeze_trainable_layers")


def form_specs(groups: tuple[str, ...] = FORM_GROUPS) -> list[dict]:
    from roctune import config

    return [s for s in config.form_fields(groups) if s["name"] not in PAGE_NEVER]


def elem_id(name: str) -> str:
    return "rt-train-" + name.replace("_", "-")


PICKS = {"data": "datasets", "eval_data": "datasets", "model": "models", "adapter": "runs"}  # lists to pick from


def component(gr, spec: dict, value: Any = None, **extra):
    """The Gradio component for one setting. Inclusive bounds (ge, le) become the number box's min/max; the
    exclusive ones (gt, lt) are left to `validate`, which shows the CLI's message for them. Datasets, the base
    model and the adapter are dropdowns of what the workspace holds (free text still allowed; `PICKS` names the
    list, filled in by the page). A default that means "not set" shows as an empty box."""
    name, kind, default = spec["name"], spec["kind"], spec["default"]
    kw = dict(label=name.replace("_", " "), info=spec["help"], elem_id=elem_id(name), **extra)
    value = default if value is None else value
    if name in PICKS:
        multi = kind == "list"
        return gr.Dropdown([], value=value if multi else (value or None), multiselect=multi, allow_custom_value=True,
                           **kw)
    if spec["choices"]:  # a list with choices (report_to) picks several
        return gr.Dropdown(list(spec["choices"]), value=value, multiselect=kind == "list", **kw)
    if kind == "bool":
        return gr.Checkbox(value=bool(value), **kw)
    if kind in ("int", "float") and spec.get("unset") is not None:  # a number box cannot be empty: text
        return gr.Textbox(value="" if value == spec["unset"] else str(value), placeholder="unset", **kw)
    if kind in ("int", "float"):
        b = spec["bounds"]
        return gr.Number(value=value, precision=0 if kind == "int" else None, minimum=b.get("ge"),
                         maximum=b.get("le"), **kw)
    if kind == "list":
        return gr.Textbox(value=value if callable(value) else " ".join(value), lines=1, **kw)
    return gr.Textbox(value=value if callable(value) else (value or ""), **kw)


def form_values(cfg, names: list[str]) -> list:
    """The form's values for `cfg` (settings loaded from a file), in the order of `names`."""
    specs = {s["name"]: s for s in form_specs()}
    out = []
    for name in names:
        spec, value = specs[name], getattr(cfg, name)
        if name in PICKS:
            out.append(value if spec["kind"] == "list" else (value or None))
        elif spec["kind"] == "list" and not spec["choices"]:
            out.append(" ".join(value))
        elif spec["kind"] in ("int", "float") and spec.get("unset") is not None:
            out.append("" if value == spec["unset"] else str(value))
        else:
            out.append("" if value is None else value)
    return out


def _value(spec: dict, raw: Any, ws) -> Any:
    """One form value as `config.apply` takes it (paths resolved in the workspace); None: keep the default."""
    from roctune.webui.data import data_paths

    name, kind = spec["name"], spec["kind"]
    if kind in ("int", "float"):
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            return None
        if isinstance(raw, str):
            return raw.strip()  # config.apply reads it as the CLI does, with the CLI's message when it is not one
        return int(raw) if kind == "int" and float(raw).is_integer() else raw
    if kind == "list" and name in REPEAT_LISTS:
        return ws.data(data_paths(raw), "--" + name.replace("_", "-"))
    if kind == "list" or kind == "bool" or spec["choices"]:
        return raw
    text = (raw or "").strip()
    if name == "model":
        return ws.model(text)
    if name in ("adapter", "reward_model") and text:  # a run directory inside the workspace, on a known base model
        return ws.adapter(text, "--" + name.replace("_", "-"))
    if name in PATH_FIELDS and text:
        return ws.path(text, "--" + name, write=name == "output")
    return text if text or spec["default"] is not None else None


def fill_config(values: dict[str, Any], ws):
    """A TrainConfig from form values {name: value} (missing names keep their defaults), unchecked.
    Returns (cfg, trust_remote_code): that one goes on the command line, never into the YAML file."""
    from roctune import config

    specs = {s["name"]: s for s in form_specs(tuple(config.GROUP_TITLES))}
    trust = ws.check_trust(bool(values.get("trust_remote_code")))
    cfg = config.TrainConfig()
    settings = {}
    for name, raw in values.items():
        if name == "trust_remote_code":
            continue
        v = _value(specs[name], raw, ws)
        if v is not None or specs[name]["default"] is None:
            settings[name] = v
    config.apply(cfg, settings, "the form")
    cfg.trust_remote_code = trust
    return cfg, trust


def form_config(values: dict[str, Any], ws):
    """`fill_config`, then the checks `roctune train` makes before loading anything, so that a mistake shows at
    once instead of after a process start: the same code raises the same message. Every value of the form goes
    through them (`TrainConfig.validate`: bounds, choices, names, control characters; the chat template's name
    against the table; the output folder)."""
    from roctune.data import templates
    from roctune.rundir.output import check_new_output

    cfg, trust = fill_config(values, ws)
    cfg.validate()
    if cfg.template:
        templates.get(cfg.template)
    check_new_output(cfg.output, cfg.resume, cfg.overwrite)
    return cfg, trust
