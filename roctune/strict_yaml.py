"""YAML as roctune reads it (config files, run.yaml, task files): PyYAML's safe loader (no tags, no objects), plus
two refusals a settings file never needs:
- more than MAX_ALIASES aliases: an alias bomb (`a: &a [*b, *b, ...]` nested) expands to billions of references that
  every reader after the load walks for minutes and gigabytes; real config files use a handful, if any;
- a key given twice in one mapping: PyYAML keeps the last one without a word, so `lr: 1e-4 ... lr: 1e-3` would
  silently train with the second.
Both raise yaml.YAMLError subclasses with the line, so callers report them like any other YAML error."""
from __future__ import annotations

from typing import Any

MAX_ALIASES = 100


def _loader():
    import yaml
    from yaml.constructor import ConstructorError

    class StrictLoader(yaml.SafeLoader):
        aliases = 0

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                self.aliases += 1
                if self.aliases > MAX_ALIASES:
                    raise ConstructorError(None, None, f"more than {MAX_ALIASES} aliases (*name): refused as an "
                                           "alias bomb", self.peek_event().start_mark)
            return super().compose_node(parent, index)

        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, (str, int, float, bool)) or key is None:
                    if key in seen:
                        raise ConstructorError(None, None, f"key {key!r} is given twice", key_node.start_mark)
                    seen.add(key)
            return super().construct_mapping(node, deep)

    return StrictLoader


def load(stream) -> Any:
    """The document in `stream` (text or a file), strictly: see the module docstring."""
    import yaml

    return yaml.load(stream, Loader=_loader())  # noqa: S506 - a SafeLoader subclass
