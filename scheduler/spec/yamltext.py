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

import re
import sys
from collections.abc import Callable
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

# Nodes that alias uses may add to one document. Far above any real manifest's reuse, far below what
# exhausts memory (a 10**5-node expansion validates in well under a second).
MAX_ALIAS_NODES = 100_000

# Text that a job carries inside one field and that vramfit parses: the spec annotation, a trainer config in an
# env var, a RayJob's runtimeEnvYAML, a container's shell script. Real ones take a few KiB (a whole axolotl
# config is about 2 KiB). Pure-Python YAML costs about 8 s per MiB of dense flow lists and shlex grows a long
# word one character at a time, while a review body may be 8 MiB: at 64 KiB the slowest parse of one field is
# about 0.5 s (bench/hostile_reviews.py). Kubernetes itself allows 256 KiB for all annotations of an object
# together (apimachinery's TotalAnnotationSizeLimitB).
MAX_EMBEDDED_CHARS = 64 * 1024
# All such text of one job together (its containers' scripts and inline configs): a Pod template may have many
# containers, and each may carry a field just under the cap. Two fields' worth bounds a review near 1 s.
MAX_JOB_EMBEDDED_CHARS = 2 * MAX_EMBEDDED_CHARS

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


def too_long(text: str, limit: int = MAX_EMBEDDED_CHARS) -> str | None:
    """``is 70,000 characters long; vramfit reads at most 65,536 (64 KiB) here`` when ``text`` is over ``limit``."""
    if len(text) <= limit:
        return None
    return f"is {len(text):,} characters long; vramfit reads at most {limit:,} ({limit / 1024:g} KiB) here"


MAX_PATTERN_EXPANSIONS = 256


class TextBudget:
    """What one job may still have parsed of embedded text: each field at most :data:`MAX_EMBEDDED_CHARS`,
    all fields together at most ``total`` characters. Keeps a note for every text it refuses."""

    def __init__(self, total: int = MAX_JOB_EMBEDDED_CHARS) -> None:
        self.total = total
        self.left = total
        self.notes: list[str] = []
        # bash pattern expansions (``${VAR##*/}``) one job's scripts may have evaluated: each compiles and runs a
        # regular expression; past this they stay as written (real scripts have a handful)
        self.pattern_expansions_left = MAX_PATTERN_EXPANSIONS

    def refuse(self, text: str, what: str) -> str | None:
        """``WHAT is N characters long ...; it was not read`` when ``text`` may not be parsed (the note is also
        kept in :attr:`notes`); None when it may, and its length is taken from what is left."""
        reason = too_long(text)
        if reason is None and len(text) > self.left:
            reason = (f"is {len(text):,} characters long, past the {self.total:,} characters of scripts and configs "
                      "that vramfit reads of one job")
        if reason is None:
            self.left -= len(text)
            return None
        self.notes.append(f"{what} {reason}; it was not read")
        return self.notes[-1]


def substitute_within(pattern: re.Pattern[str], text: str, lookup: Callable[[re.Match[str]], str | None],
                      budget: TextBudget) -> str:
    """``pattern.sub`` with ``lookup``'s replacement for each match, where what the replacements add to the text
    is taken from ``budget``; a match ``lookup`` has no value for, or whose value would take more than is left,
    stays as written. Variable expansion (``$(VAR)`` in a manifest, ``$VAR`` in a script) goes through it: values
    that each repeat the one before ten times would otherwise grow tenfold per level."""

    def replace(m: re.Match[str]) -> str:
        out = lookup(m)
        if out is None:
            return m.group(0)
        growth = len(out) - len(m.group(0))
        if growth > budget.left:
            return m.group(0)
        budget.left -= max(growth, 0)
        return out

    return pattern.sub(replace, text)


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


def duplicate_key(node: Node) -> tuple[str, Node] | None:
    """A key written twice in one mapping of the document under ``node`` (what, and the second key), or None.
    Checked on the node tree as the parser built it, before merge keys (``<<``) are flattened into the mappings
    that use them (a mapping's own key overriding a merged one is YAML, not a duplicate); each node once."""
    seen_nodes: set[int] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if id(n) in seen_nodes:
            continue
        seen_nodes.add(id(n))
        if isinstance(n, MappingNode):
            keys: dict[tuple[str, str], Node] = {}
            for key_node, value_node in n.value:
                stack += [key_node, value_node]
                if not isinstance(key_node, ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                first = keys.setdefault((key_node.tag, key_node.value), key_node)
                if first is not key_node:
                    return (f"the key {key_node.value!r} is written twice in one mapping (first on line "
                            f"{first.start_mark.line + 1})"), key_node
        elif isinstance(n, SequenceNode):
            stack += n.value
    return None


class BoundedSafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that checks each document's alias expansion before it builds Python objects, turns an
    integer too long for Python's ``int`` (more than 4,300 digits) into a YAML error with its line, and refuses a
    key written twice in one mapping (PyYAML keeps the last silently; kubectl refuses such a manifest)."""

    unique_keys = True

    def construct_document(self, node: Node) -> Any:
        alias_expansion(node)
        if self.unique_keys and (duplicate := duplicate_key(node)) is not None:
            raise ConstructorError(None, None, duplicate[0], duplicate[1].start_mark)
        return super().construct_document(node)

    def construct_bounded_int(self, node: Node) -> int:
        try:
            return int(self.construct_yaml_int(node))  # type: ignore[arg-type]
        except ValueError:  # Python refuses to convert more than sys.get_int_max_str_digits() digits
            limit = sys.get_int_max_str_digits()
            raise ConstructorError(None, None, f"an integer of {len(str(node.value)):,} characters is too long "
                                   f"(at most {limit:,} digits)", node.start_mark) from None


BoundedSafeLoader.add_constructor("tag:yaml.org,2002:int", BoundedSafeLoader.construct_bounded_int)


class TrainerConfigLoader(BoundedSafeLoader):
    """For the trainer configs vramfit reads out of a job (axolotl, LLaMA-Factory, DeepSpeed): the trainer reads
    them with PyYAML, where a repeated key's last value wins, so vramfit reads them the same way."""

    unique_keys = False


def safe_load(text: str, unique_keys: bool = True) -> Any:
    """``yaml.safe_load`` with the alias cap; a key written twice is an error unless not ``unique_keys``."""
    return yaml.load(text, Loader=BoundedSafeLoader if unique_keys else TrainerConfigLoader)


def safe_load_all(text: str) -> list[Any]:
    """``yaml.safe_load_all`` with the alias cap, as a list (every document is checked as it is read)."""
    return list(yaml.load_all(text, Loader=BoundedSafeLoader))
