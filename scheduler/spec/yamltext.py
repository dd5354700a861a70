"""YAML from users, read safely: PyYAML's safe loader plus a cap on what aliases expand to.

``yaml.safe_load`` refuses arbitrary objects but not a "billion laughs" document: nine anchors, each a
list of ten aliases to the one before, take 300 bytes and stand for a billion nodes. PyYAML builds
them as shared references in a millisecond; whatever walks the result afterwards (validation, a deep
copy, a JSON dump into an annotation or the ledger) runs out of memory. A webhook reads such text from
any annotation, environment variable or ``runtimeEnvYAML`` of a job that someone submits, so every
YAML that comes from a job or a file goes through :func:`safe_load` / :func:`safe_load_all`.

The cap counts only what aliases add: each time an alias is used, the nodes under its anchor. A
document without aliases costs what its text costs, however large; ordinary anchors (a shared
``resources`` block, a reused env list) add tens or hundreds of nodes. Go's yaml library, which
kubectl uses, refuses excessive aliasing in the same spirit. A recursive anchor (an alias inside the
node it names) is refused too: nothing in a spec or a manifest is a cycle.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

# Nodes that alias uses may add to one document. Far above any real manifest's reuse, far below what
# exhausts memory (a 10**5-node expansion validates in well under a second).
MAX_ALIAS_NODES = 100_000

# What a YAML (or JSON) parse of user input may raise: PyYAML's errors (the alias cap's included), and
# RecursionError for a document nested thousands of levels deep (PyYAML's composer recurses per level).
YAML_ERRORS: tuple[type[BaseException], ...] = (yaml.YAMLError, RecursionError)


class AliasExpansionError(yaml.YAMLError):
    """A document whose aliases expand beyond :data:`MAX_ALIAS_NODES` nodes, or refer to themselves."""


def yaml_error_text(exc: BaseException) -> str:
    """``is not valid YAML at line L, column C: PROBLEM`` for a PyYAML error (or a document nested too deeply)."""
    if isinstance(exc, RecursionError):
        return "is not valid YAML: nested too deeply"
    if isinstance(exc, AliasExpansionError):
        return f"is refused: {exc}"
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"is not valid YAML{where}: {problem}"


def yaml_error_hint(exc: BaseException) -> str:
    """The fix to print after :func:`yaml_error_text`: none for a refused alias expansion, whose text says it."""
    return "" if isinstance(exc, AliasExpansionError) else "fix the syntax"


def alias_expansion(node: Node, limit: int = MAX_ALIAS_NODES) -> int:
    """Nodes that alias uses add to the document under ``node``; raises :class:`AliasExpansionError`
    past ``limit`` or on a recursive anchor.

    In PyYAML's composed graph an alias is the anchored node itself, reached a second time, so the sizes
    are memoised by identity: the walk visits each distinct node once, whatever the expansion.
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    added = 0

    def size(n: Node) -> int:
        nonlocal added
        key = id(n)
        if key in sizes:  # a second reference: an alias
            added += sizes[key]
            if added > limit:
                mark = n.start_mark
                raise AliasExpansionError(
                    f"its aliases expand to more than {limit:,} nodes (the alias of the anchor at line "
                    f"{mark.line + 1} among them); write the values out or use fewer nested aliases")
            return sizes[key]
        if key in open_nodes:
            mark = n.start_mark
            raise AliasExpansionError(
                f"the anchor at line {mark.line + 1} is used inside itself (a recursive structure)")
        open_nodes.add(key)
        total = 1
        if isinstance(n, SequenceNode):
            total += sum(size(child) for child in n.value)
        elif isinstance(n, MappingNode):
            total += sum(size(k) + size(v) for k, v in n.value)
        open_nodes.discard(key)
        sizes[key] = total
        return total

    size(node)
    return added


class BoundedSafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that checks each document's alias expansion before it builds Python objects."""

    def construct_document(self, node: Node) -> Any:
        alias_expansion(node)
        return super().construct_document(node)


def safe_load(text: str) -> Any:
    """``yaml.safe_load`` with the alias cap."""
    return yaml.load(text, Loader=BoundedSafeLoader)


def safe_load_all(text: str) -> list[Any]:
    """``yaml.safe_load_all`` with the alias cap, as a list (every document is checked as it is read)."""
    return list(yaml.load_all(text, Loader=BoundedSafeLoader))
