"""Dataset sources: the files one --data value names, and how their records map to the known formats.

A --data value is a file, or a LLaMA-Factory data directory as DIR:name[,name...] (DIR alone when its
dataset_info.json holds a single dataset); each entry's file_name, formatting, columns and tags are honoured,
including sharegpt's `function_tag` / `observation_tag` turns and the `tools` column of tool-calling datasets.
A trailing `:W` (a number) is a mixing weight (`a.jsonl:0.7`, `DIR:name:0.3`; see `split_weight`).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

from roctune.data.formats import field_text, maybe_json, parse_turns, record_tools, to_messages
from roctune.data.images import check_marker_count, read_image, read_images
from roctune.errors import DataError

_DATA_SUFFIXES = (".json", ".jsonl", ".csv", ".tsv", ".parquet", ".pq")


@dataclass
class Source:
    """One file to read, with the LLaMA-Factory mapping that applies to it (if it came from dataset_info.json)."""

    path: str
    dataset: str | None = None
    formatting: str | None = None  # "alpaca" | "sharegpt" for LLaMA-Factory datasets
    columns: dict = field(default_factory=dict)
    tags: dict = field(default_factory=dict)
    root: str | None = None  # the LLaMA-Factory data directory it came from: image paths may be relative to it

    def to_messages(self, obj: dict, where: str) -> list[dict[str, str]]:
        """The record as a training conversation (roles in order), through the dataset's mapping if any."""
        if self.formatting is not None:
            obj = _llamafactory_record(obj, self, where)
        return to_messages(obj, where, check_order=True)

    def to_tools(self, obj: dict, where: str) -> list[dict] | None:
        """The record's tool list: its `tools` field, or the column dataset_info.json maps `tools` to."""
        return record_tools(obj, where, self.columns.get("tools", "tools"))

    def to_images(self, obj: dict, messages: list[dict], where: str) -> list:
        """The record's images, checked (roctune.data.images.ImageRef), in the order the turns place them: the
        images of content parts (taken out of `messages`), or the `images` column (or the column dataset_info.json
        maps `images` to) with one <image> tag in the turns per image. Paths are relative to the data file's folder
        (or to the LLaMA-Factory data directory, as LLaMA-Factory reads them)."""
        inline = [item for m in messages for item in m.pop("images", ())]
        key = self.columns.get("images", "images")
        column = maybe_json(obj.get(key), where, key)
        if not inline and column in (None, "", []):
            return []
        roots = [os.path.dirname(os.path.abspath(self.path))]
        if self.root and os.path.abspath(self.root) not in roots:
            roots.append(os.path.abspath(self.root))
        if inline:
            if column not in (None, "", []):
                raise DataError(f"{where}: images both in content parts and in field '{key}'; give them one way")
            return [read_image(value, roots, here) for value, here in inline]
        images = read_images(column, roots, where, key)
        check_marker_count(messages, images, where, key)
        return images


_WEIGHT = re.compile(r"^(?P<rest>.+):(?P<w>\d+(?:\.\d*)?(?:e-?\d+)?|\.\d+)$")


def split_weight(spec: str) -> tuple[str, float | None]:
    """A --data value and its mixing weight: `PATH:W`, `DIR:W` or `DIR:name:W` (W > 0), weight None without one.

    A trailing `:number` is a weight only when the whole value names nothing on disk and what is left does, and
    for `DIR:number` only when DIR's dataset_info.json has no dataset of that name, so `DIR:name` keeps its
    meaning even for datasets named by a number."""
    m = _WEIGHT.match(spec)
    if not m or os.path.exists(spec):
        return spec, None
    rest = m["rest"]
    base = rest if os.path.exists(rest) else rest.rpartition(":")[0]
    if not os.path.isdir(base) and not os.path.isfile(rest):
        return spec, None
    if os.path.isdir(rest) and m["w"] in _dataset_names(rest):
        return spec, None
    weight = float(m["w"])
    if not 0 < weight < float("inf"):
        raise DataError(f"--data {spec}: the mixing weight must be > 0 and finite (got {m['w']})")
    return rest, weight


def _dataset_names(directory: str) -> set[str]:
    try:
        with open(os.path.join(directory, "dataset_info.json"), encoding="utf-8") as f:
            info = json.load(f)
        return set(info) if isinstance(info, dict) else set()
    except (OSError, ValueError):
        return set()


def resolve_sources(spec: str) -> list[Source]:
    """The files named by one --data value: a file, or DIR:name[,name...] for a LLaMA-Factory data directory
    (DIR alone when its dataset_info.json holds a single dataset); a mixing weight (`:W`) is left aside."""
    spec, _ = split_weight(spec)
    if os.path.isfile(spec):
        return [Source(spec)]
    directory, names = spec, None
    if not os.path.isdir(spec) and ":" in spec:
        directory, _, names = spec.rpartition(":")
    if not os.path.isdir(directory):
        raise DataError(f"{spec}: no such file (check the path given to --data)")
    info_path = os.path.join(directory, "dataset_info.json")
    info = _read_dataset_info(directory, info_path)
    available = ", ".join(sorted(info))
    if not names:
        if len(info) != 1:
            raise DataError(f"{directory}: holds several datasets; pick one or more as {directory}:NAME[,NAME] "
                            f"(datasets: {available})")
        names = next(iter(info))
    sources = []
    for name in [n.strip() for n in names.split(",") if n.strip()]:
        entry = info.get(name)
        if entry is None:
            raise DataError(f"{info_path}: no dataset named '{name}' (datasets: {available})")
        sources += _entry_sources(directory, f"{info_path}: dataset '{name}'", name, entry)
    return sources


def _read_dataset_info(directory: str, info_path: str) -> dict:
    if not os.path.isfile(info_path):
        raise DataError(f"{directory}: is a directory without dataset_info.json; give a .jsonl, .json, .csv or "
                        ".parquet file, or a LLaMA-Factory data directory as DIR:name")
    try:
        with open(info_path, encoding="utf-8") as f:
            info = json.load(f)
    except UnicodeDecodeError:
        raise DataError(f"{info_path}: not UTF-8 text; re-save the file as UTF-8") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{info_path}:{e.lineno}: invalid JSON ({e.msg})") from None
    except (RecursionError, ValueError):
        raise DataError(f"{info_path}: JSON nested too deeply or with numbers too long to be a dataset list") from None
    if not isinstance(info, dict) or not info:
        raise DataError(f"{info_path}: expected an object mapping dataset names to their descriptions")
    return info


def _entry_sources(directory: str, where: str, name: str, entry) -> list[Source]:
    """The files of one dataset_info.json entry (its file_name is a file or a folder of files)."""
    if not isinstance(entry, dict):
        raise DataError(f"{where}: expected an object with 'file_name'")
    file_name = entry.get("file_name")
    if not isinstance(file_name, str) or not file_name:
        remote = [k for k in ("hf_hub_url", "ms_hub_url", "script_url", "om_hub_url") if k in entry]
        hint = f" ({remote[0]} datasets are not supported; download it and set file_name)" if remote else ""
        raise DataError(f"{where}: field 'file_name' is missing{hint}")
    formatting = entry.get("formatting", "alpaca")
    if formatting not in ("alpaca", "sharegpt"):
        raise DataError(f"{where}: field 'formatting' is {formatting!r}; expected 'alpaca' or 'sharegpt'")
    columns, tags = entry.get("columns") or {}, entry.get("tags") or {}
    if not isinstance(columns, dict) or not isinstance(tags, dict):
        raise DataError(f"{where}: fields 'columns' and 'tags' must be objects")
    path = os.path.join(directory, file_name)
    if os.path.isdir(path):
        files = sorted(os.path.join(path, n) for n in os.listdir(path) if n.lower().endswith(_DATA_SUFFIXES))
        if not files:
            raise DataError(f"{where}: folder {path} holds no .json, .jsonl, .csv or .parquet files")
    elif os.path.isfile(path):
        files = [path]
    else:
        raise DataError(f"{where}: file_name {file_name!r}: no such file in {directory}")
    return [Source(p, name, formatting, columns, tags, directory) for p in files]


def sharegpt_tags(src: Source) -> tuple[str, str, dict[str, str]]:
    """(role key, content key, role map) of a LLaMA-Factory sharegpt dataset, from its tags."""
    tags = src.tags
    role_map = {tags.get("user_tag", "human"): "user", tags.get("assistant_tag", "gpt"): "assistant",
                tags.get("system_tag", "system"): "system",
                tags.get("function_tag", "function_call"): "function_call",
                tags.get("observation_tag", "observation"): "tool"}
    return tags.get("role_tag", "from"), tags.get("content_tag", "value"), role_map


def _llamafactory_record(obj: dict, src: Source, where: str) -> dict:
    """Map a record of a LLaMA-Factory dataset to the internal alpaca or messages shape, checking the
    user's own column and tag names so errors name them."""
    cols = src.columns
    if src.formatting == "alpaca":
        prompt, query, response = (cols.get("prompt", "instruction"), cols.get("query", "input"),
                                   cols.get("response", "output"))
        out = {"instruction": field_text(obj, prompt, where), "output": field_text(obj, response, where),
               "input": field_text(obj, query, where, required=False) if query else ""}
        if cols.get("system"):
            out["system"] = field_text(obj, cols["system"], where, required=False)
        if cols.get("history") and obj.get(cols["history"]) is not None:
            out["history"] = maybe_json(obj[cols["history"]], where, cols["history"])
        return out
    key = cols.get("messages", "conversations")
    role_tag, content_tag, role_map = sharegpt_tags(src)
    turns = maybe_json(obj.get(key), where, key)
    msgs = parse_turns(turns, where, key, role_tag, content_tag, role_map,
                       f"{', '.join(map(repr, role_map))} (the tags in dataset_info.json)")
    out = {"messages": msgs}
    if cols.get("system"):
        out["system"] = field_text(obj, cols["system"], where, required=False)
    return out
