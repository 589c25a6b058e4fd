"""YAML as roctune reads it (config files, run.yaml, task files): PyYAML's safe loader (no tags, no objects), plus
three refusals a settings file never needs:
- more than MAX_ALIASES aliases: an alias bomb (`a: &a [*b, *b, ...]` nested) expands to billions of references that
  every reader after the load walks for minutes and gigabytes; real config files use a handful, if any;
- aliases that expand the document by more than MAX_ALIAS_NODES nodes: 72 aliases (under the alias cap) nested
  nine deep already stand for 9^9 references; the expanded size is counted on the composed node graph (each node
  once, memoized), before anything is built, so a bomb is refused in milliseconds and a large plain file (no
  aliases) is never limited;
- a key given twice in one mapping: PyYAML keeps the last one without a word, so `lr: 1e-4 ... lr: 1e-3` would
  silently train with the second.
All raise yaml.YAMLError subclasses with the line, so callers report them like any other YAML error."""
from __future__ import annotations

from typing import Any

MAX_ALIASES = 100
MAX_ALIAS_NODES = 100_000  # nodes that aliases may add once expanded: far above any real use, milliseconds to walk


def check_expansion(root) -> None:
    """Refuse a composed YAML node graph whose aliases add more than MAX_ALIAS_NODES nodes once expanded, or that
    contains itself. Iterative (deep nesting must not recurse) and memoized by node, so a shared subtree is walked
    once; a node reached again while it is being walked is a recursive alias. The line named is that of the
    smallest collection that is over the limit on its own."""
    from yaml.constructor import ConstructorError
    from yaml.nodes import MappingNode, SequenceNode

    size: dict[int, int] = {}
    order: list = []  # post-order: smaller collections first
    stack, walking = [(root, False)], set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            walking.discard(key)
            size[key] = 1 + sum(size[id(k)] for k in _children(node, MappingNode, SequenceNode))
            order.append(node)
        elif key in walking:
            raise ConstructorError(None, None, "a recursive alias (a collection that contains itself): refused",
                                   node.start_mark)
        elif key not in size:
            walking.add(key)
            stack.append((node, True))
            stack.extend((k, False) for k in _children(node, MappingNode, SequenceNode) if id(k) not in size)
    distinct = len(size)
    if size[id(root)] - distinct <= MAX_ALIAS_NODES:
        return
    # over the limit: a collection whose size passes limit + every distinct node is over it by aliases alone
    culprit = next(n for n in order if size[id(n)] > MAX_ALIAS_NODES + distinct)
    raise ConstructorError(None, None, f"aliases (*name) expand this to {size[id(root)]:,} nodes (at most "
                           f"{MAX_ALIAS_NODES:,} more than written): refused as an alias bomb", culprit.start_mark)


def _children(node, mapping, sequence) -> list:
    if isinstance(node, mapping):
        return [n for pair in node.value for n in pair]
    return list(node.value) if isinstance(node, sequence) else []


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

        def compose_document(self):
            node = super().compose_document()
            check_expansion(node)
            return node

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


def error_line(path: str, e: Exception) -> str:
    """`path:LINE: invalid YAML (what is wrong)` for a YAML error from `load`, the one line every reader reports."""
    mark = getattr(e, "problem_mark", None)
    where = f":{mark.line + 1}" if mark else ""
    return f"{path}{where}: invalid YAML ({getattr(e, 'problem', None) or e})"


def load(stream) -> Any:
    """The document in `stream` (text or a file), strictly: see the module docstring."""
    import yaml

    return yaml.load(stream, Loader=_loader())  # noqa: S506 - a SafeLoader subclass
