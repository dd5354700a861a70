"""What a carried Python training script states about itself, read from its syntax tree (never run).

A Ray Train job (``python train.py`` on the head, ``TorchTrainer(..., scaling_config=ScalingConfig(num_workers=N,
use_gpu=True))`` inside) and many team scripts keep their settings in the script: argparse defaults, a
``ScalingConfig``, a DeepSpeed config written as a dict literal, the model named in ``from_pretrained("...")``. When
the manifest carries the script (a ConfigMap key mounted where the command runs it, or a heredoc), these are read:

* ``parser.add_argument("--name", ..., default=LITERAL)`` (a string or a number): the default, as if the command
  had passed ``--name LITERAL``, unless it passes the flag itself; HfArgumentParser dataclasses'
  ``name: T = field(default=LITERAL)`` (or ``= LITERAL``) likewise;
* ``ScalingConfig(num_workers=N, use_gpu=True)`` (or ``resources_per_worker`` with ``GPU``): the Ray Train workers,
  one GPU each;
* a dict literal with a ``zero_optimization`` key: the DeepSpeed config, its ``args.NAME`` values resolved from the
  command's flags and the argparse defaults (entries that cannot be resolved are left out);
* ``AutoModel*.from_pretrained("org/name")`` / ``*ForCausalLM.from_pretrained("org/name")`` with one literal model:
  the model, when nothing else names it.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# a script larger than this is not parsed (training entry points are a few hundred lines, under 64 KiB; Ray's
# DeepSpeed example is 9 KiB), nor more defaults read than this (transformers' TrainingArguments has about 150)
MAX_SCRIPT_BYTES = 256 << 10
MAX_DEFAULTS = 400
_UNRESOLVED = object()


@dataclass
class ScriptFacts:
    defaults: list[tuple[str, Any]] = field(default_factory=list)  # (flag name without dashes, value)
    workers: int | None = None
    deepspeed: dict[str, Any] | None = None
    model: str | None = None


def _literal(node: ast.AST | None) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float)) and not isinstance(
            node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
            and isinstance(node.operand.value, (int, float)) and not isinstance(node.operand.value, bool):
        return -node.operand.value
    return _UNRESOLVED


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _argparse_default(call: ast.Call) -> tuple[str, Any] | None:
    flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    long = next((f for f in flags if f.startswith("--")), None)
    keywords = {k.arg: k.value for k in call.keywords if k.arg}
    default = _literal(keywords.get("default"))
    if long is None or default is _UNRESOLVED:
        return None
    dest = keywords.get("dest")
    name = dest.value if isinstance(dest, ast.Constant) and isinstance(dest.value, str) else long[2:]
    return name.replace("-", "_").lower(), default


def _dataclass_defaults(tree: ast.Module) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        if not any(_name(d.func if isinstance(d, ast.Call) else d) == "dataclass" for d in cls.decorator_list):
            continue
        for item in cls.body:
            if not isinstance(item, ast.AnnAssign) or not isinstance(item.target, ast.Name) or item.value is None:
                continue
            value = item.value
            if isinstance(value, ast.Call) and _name(value.func) == "field":
                value = next((k.value for k in value.keywords if k.arg == "default"), None)
            literal = _literal(value)
            if literal is not _UNRESOLVED:
                found.append((item.target.id.lower(), literal))
    return found


def read_script(source: str, given: Mapping[str, Any]) -> ScriptFacts | None:
    """The facts of a Python script (``given``: the command's own flag values, by normalised name), or None when the
    text is no Python this can parse."""
    if len(source.encode("utf-8", "replace")) > MAX_SCRIPT_BYTES:
        return None
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    facts = ScriptFacts()
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    seen: set[str] = set()
    for call in calls:
        if isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument":
            pair = _argparse_default(call)
            if pair is not None and pair[0] not in seen and len(seen) < MAX_DEFAULTS:
                seen.add(pair[0])
                facts.defaults.append(pair)
    for name, value in _dataclass_defaults(tree):
        if name not in seen and len(seen) < MAX_DEFAULTS:
            seen.add(name)
            facts.defaults.append((name, value))
    values = {**dict(facts.defaults), **given}
    constants = _module_constants(tree)

    def evaluate(node: ast.AST) -> Any:
        literal = _literal(node)
        if literal is not _UNRESOLVED:
            return literal
        if isinstance(node, ast.Constant) and isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Attribute) and isinstance(node.value, (ast.Name, ast.Attribute)):
            return values.get(node.attr.lower(), _UNRESOLVED)  # args.batch_size: the flag's value
        if isinstance(node, ast.Name):
            return constants.get(node.id, _UNRESOLVED)
        if isinstance(node, ast.Dict):
            out: dict[str, Any] = {}
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    resolved = evaluate(value)
                    if resolved is not _UNRESOLVED:
                        out[key.value] = resolved
            return out
        return _UNRESOLVED

    models: set[str] = set()
    for call in calls:
        callee = _name(call.func)
        keywords = {k.arg: k.value for k in call.keywords if k.arg}
        if callee == "ScalingConfig" and "num_workers" in keywords:
            workers = evaluate(keywords["num_workers"])
            gpu = evaluate(keywords["use_gpu"]) if "use_gpu" in keywords else False
            per_worker = evaluate(keywords["resources_per_worker"]) if "resources_per_worker" in keywords else {}
            wants_gpu = gpu is True or (isinstance(per_worker, dict) and bool(per_worker.get("GPU")))
            if isinstance(workers, int) and not isinstance(workers, bool) and workers > 0 and wants_gpu:
                facts.workers = workers
        elif callee == "from_pretrained" and isinstance(call.func, ast.Attribute) and call.args:
            owner = _name(call.func.value)
            model = call.args[0]
            if (owner.startswith("AutoModel") or owner.endswith(("ForCausalLM", "LMHeadModel"))) and isinstance(
                    model, ast.Constant) and isinstance(model.value, str) and model.value.strip():
                models.add(model.value.strip())
    if len(models) == 1:
        facts.model = models.pop()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == "zero_optimization"
                                              for k in node.keys):
            config = evaluate(node)
            if isinstance(config, dict) and isinstance(config.get("zero_optimization"), dict):
                facts.deepspeed = config
                break
    return facts


def _module_constants(tree: ast.Module) -> dict[str, Any]:
    """Module-level ``NAME = LITERAL`` assignments (``MODEL_ID = "Qwen/Qwen2.5-7B"``)."""
    out: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = _literal(node.value)
            if value is not _UNRESOLVED:
                out[node.targets[0].id] = value
    return out


def default_flags(facts: ScriptFacts, given: Sequence[str]) -> list[str]:
    """``--name value`` words for the script's defaults the command does not pass itself."""
    words: list[str] = []
    for name, value in facts.defaults:
        if name not in given:
            words += [f"--{name}", str(value)]
    return words
