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
* ``AutoModel*.from_pretrained("org/name")`` / ``*ForCausalLM.from_pretrained("org/name")`` /
  Unsloth's ``FastLanguageModel.from_pretrained(model_name=...)`` with one model (a literal, a module constant or an
  ``args.NAME`` the command or a default gives): the model, when nothing else names it;
* the keyword arguments of the calls that configure training, as the flags of the same names:
  ``TrainingArguments(...)`` and TRL's ``SFTConfig(...)`` / ``DPOConfig(...)`` / ..., ``SFTTrainer(...)``'s own
  (``max_seq_length``, ``packing``), PEFT's ``LoraConfig(r=..., target_modules=[...])``, ``BitsAndBytesConfig(...)``,
  ``from_pretrained(..., load_in_4bit=True, torch_dtype=torch.bfloat16, attn_implementation=...)``, Unsloth's
  ``get_peft_model(model, r=..., use_gradient_checkpointing="unsloth")`` with its defaults, and
  ``model.gradient_checkpointing_enable()``. A call under an ``if`` whose test resolves false is skipped; a value
  that is no literal and cannot be resolved is left out.
"""

from __future__ import annotations

import ast
import re
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
    # (flag name, value, where: "LoraConfig(r=...)") of the training calls' keyword arguments, first call first
    calls: list[tuple[str, Any, str]] = field(default_factory=list)
    # the TRL trainer the script builds, as TRL's CLI names its command (GRPOTrainer -> "grpo"), when it is one
    # whose training differs from a plain Trainer's (preference pairs, generation, a reference model)
    trl_command: str | None = None
    # the task the Auto class the script loads its model with trains (AutoModelForSequenceClassification -> a
    # sequence classifier), with that class's name
    task: tuple[str, str] | None = None
    # PEFT's prepare_model_for_kbit_training / prepare_model_for_int8_training called by the script: (whether it
    # turns checkpointing on, the call as written)
    kbit_prepared: tuple[bool, str] | None = None


# transformers' Auto classes -> TrainingSpec tasks (question answering: a two-output span head on every token)
_AUTO_TASKS = {"AutoModelForSequenceClassification": "seq-classification",
               "AutoModelForTokenClassification": "token-classification",
               "AutoModelForQuestionAnswering": "token-classification", "AutoModelForMaskedLM": "masked-lm",
               "AutoModelForCausalLM": "causal-lm"}


# TRL trainers -> TRL's command names (trl/cli.py; scheduler.spec.trainer_args reads those commands' semantics)
_TRL_TRAINERS = {"GRPOTrainer": "grpo", "RLOOTrainer": "rloo", "DPOTrainer": "dpo", "KTOTrainer": "kto",
                 "ORPOTrainer": "orpo", "CPOTrainer": "cpo", "RewardTrainer": "reward", "GKDTrainer": "distillation"}


def positional_names(source: str) -> list[str]:
    """The names of a script's argparse positionals, in order (``parser.add_argument("model_name")``): the words of
    the command that fill them (``python train.py meta-llama/Llama-2-7b-hf``) are those arguments' values."""
    tree = _parse(source)
    if tree is None:
        return []
    names: list[str] = []
    calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
    for call in calls:
        if isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument" and call.args:
            first = call.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value and \
                    not first.value.startswith("-") and len(call.args) == 1:
                keywords = {k.arg: k.value for k in call.keywords if k.arg}
                nargs = keywords.get("nargs")
                if nargs is not None and not (isinstance(nargs, ast.Constant) and nargs.value in (None, 1)):
                    break  # a list of words (nargs "+", "*"): the positionals after it are not matched by place
                names.append(first.value.replace("-", "_").lower())
    return names


# Classes whose keyword arguments are TrainingArguments fields (transformers, TRL's configs, Unsloth's subclass)
_ARGUMENT_CLASSES = ("TrainingArguments", "Seq2SeqTrainingArguments", "UnslothTrainingArguments", "SFTConfig",
                     "DPOConfig", "ORPOConfig", "KTOConfig", "CPOConfig", "GRPOConfig", "RewardConfig", "PPOConfig",
                     "GKDConfig", "OnlineDPOConfig", "RLOOConfig")
# TRL trainers' own length and packing arguments (before they moved into SFTConfig)
_TRAINER_CLASSES = ("SFTTrainer", "DPOTrainer", "ORPOTrainer", "KTOTrainer", "CPOTrainer", "RewardTrainer",
                    "UnslothTrainer")
_TRAINER_KEYWORDS = ("max_seq_length", "max_length", "packing", "max_prompt_length", "max_completion_length")
# LoraConfig / get_peft_model keywords -> the flags of the same meaning
_LORA_KEYWORDS = {"r": "lora_r", "lora_alpha": "lora_alpha", "lora_dropout": "lora_dropout",
                  "target_modules": "lora_target_modules", "use_dora": "use_dora",
                  "modules_to_save": "lora_modules_to_save"}
_BNB_KEYWORDS = ("load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type", "bnb_4bit_use_double_quant")
_LOAD_KEYWORDS = ("load_in_4bit", "load_in_8bit", "torch_dtype", "dtype", "attn_implementation", "max_seq_length")
# Unsloth's FastLanguageModel.get_peft_model defaults (unsloth/models/llama.py FastLlamaModel.get_peft_model) and its
# from_pretrained's load_in_4bit=True
_UNSLOTH_PEFT_DEFAULTS = {"r": 16, "lora_alpha": 16, "lora_dropout": 0.0,
                          "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                             "down_proj"],
                          "use_gradient_checkpointing": "unsloth"}
# PEFT's LoraConfig defaults (peft/tuners/lora/config.py: r 8, lora_alpha 8, lora_dropout 0.0; target_modules None:
# PEFT's per-architecture mapping, the spec's default)
_PEFT_LORA_DEFAULTS = {"r": 8, "lora_alpha": 8, "lora_dropout": 0.0}
_MAX_CALL_VALUES = 200


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


def _switch_default(call: ast.Call) -> tuple[str, bool] | None:
    """``add_argument("--name", action="store_true")`` with no default: (name, False); store_false: (name, True)."""
    keywords = {k.arg: k.value for k in call.keywords if k.arg}
    action = keywords.get("action")
    if "default" in keywords or not isinstance(action, ast.Constant) or action.value not in ("store_true",
                                                                                                "store_false"):
        return None
    flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    long = next((f for f in flags if f.startswith("--")), None)
    if long is None:
        return None
    dest = keywords.get("dest")
    name = dest.value if isinstance(dest, ast.Constant) and isinstance(dest.value, str) else long[2:]
    return name.replace("-", "_").lower(), action.value == "store_false"


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
            literal = _constant(value) if value is not None else _UNRESOLVED  # booleans too (fp16: bool = True)
            if literal is not _UNRESOLVED:
                found.append((item.target.id.lower(), literal))
    return found


def _parse(source: str) -> ast.Module | None:
    """The syntax tree of a script no larger than MAX_SCRIPT_BYTES, or None (too large, or no Python)."""
    if len(source.encode("utf-8", "replace")) > MAX_SCRIPT_BYTES:
        return None
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def read_script(source: str, given: Mapping[str, Any]) -> ScriptFacts | None:
    """The facts of a Python script (``given``: the command's own flag values, by normalised name), or None when the
    text is no Python this can parse."""
    tree = _parse(source)
    if tree is None:
        return None
    facts = ScriptFacts()
    # in the order the script makes them (ast.walk goes level by level): the first of two calls is the one kept
    calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
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
    # store_true / store_false flags without a default: False / True, for the ``if args.use_lora:`` tests only (not
    # passed on as flags: the trainers' readers take an absent switch as off already)
    implicit: dict[str, bool] = {}
    for call in calls:
        if isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument" and (
                switch := _switch_default(call)) is not None:
            implicit.setdefault(*switch)
    values = {**implicit, **dict(facts.defaults), **given}
    constants = _module_constants(tree)
    dicts = _dict_literals(tree)
    single_assignments = _single_assignments(tree)
    resolving: set[str] = set()

    def evaluate(node: ast.AST) -> Any:
        literal = _literal(node)
        if literal is not _UNRESOLVED:
            return literal
        if isinstance(node, ast.Constant) and isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Attribute) and isinstance(node.value, (ast.Name, ast.Attribute)):
            return values.get(node.attr.lower(), _UNRESOLVED)  # args.batch_size: the flag's value
        if isinstance(node, ast.Name):
            if node.id in constants:
                return constants[node.id]
            # a name the script assigns once from an expression this resolves (batch_size = int(config["bs"]))
            assigned = single_assignments.get(node.id)
            if assigned is None or node.id in resolving or len(resolving) > 8:
                return _UNRESOLVED
            resolving.add(node.id)
            try:
                return evaluate(assigned)
            finally:
                resolving.discard(node.id)
        if isinstance(node, ast.Dict):
            out: dict[str, Any] = {}
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    resolved = evaluate(value)
                    if resolved is not _UNRESOLVED:
                        out[key.value] = resolved
            return out
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and isinstance(
                node.slice, ast.Constant) and isinstance(node.slice.value, str):
            # config["batch_size"] of a dict the script writes as a literal (accelerate's nlp_example)
            table = dicts.get(node.value.id)
            return table.get(node.slice.value, _UNRESOLVED) if table is not None else _UNRESOLVED
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("int", "float") \
                and len(node.args) == 1 and not node.keywords:
            inner = evaluate(node.args[0])
            return inner if isinstance(inner, (int, float)) and not isinstance(inner, bool) else _UNRESOLVED
        return _UNRESOLVED

    models: set[str] = set()
    trl_commands: set[str] = set()
    tasks: set[tuple[str, str]] = set()
    for call in calls:
        callee, owner, keywords = call_parts(call)
        if callee == "from_pretrained" and owner in _AUTO_TASKS:
            tasks.add((_AUTO_TASKS[owner], owner))
        if callee == "from_pretrained" and owner:
            named = keywords.get("model_name", keywords.get("pretrained_model_name_or_path"))
            model = named if named is not None else call.args[0] if call.args else None
            if owner.startswith(("AutoModel", "Fast")) or owner.endswith(("ForCausalLM", "LMHeadModel")):
                value = evaluate(model) if model is not None else _UNRESOLVED
                if isinstance(value, str) and value.strip():
                    models.add(value.strip())
        if callee in _TRL_TRAINERS or callee in _TRAINER_CLASSES:
            if callee in _TRL_TRAINERS:
                trl_commands.add(_TRL_TRAINERS[callee])
            named = evaluate(keywords["model"]) if "model" in keywords else _UNRESOLVED
            if isinstance(named, str) and "/" in named and named.strip():
                models.add(named.strip())  # GRPOTrainer(model="Qwen/Qwen2-0.5B-Instruct"): TRL loads it by name
        if callee in ("prepare_model_for_kbit_training", "prepare_model_for_int8_training") and \
                facts.kbit_prepared is None:
            # PEFT: use_gradient_checkpointing defaults to True (it calls gradient_checkpointing_enable)
            switch = evaluate(keywords["use_gradient_checkpointing"]) if "use_gradient_checkpointing" in keywords \
                else True
            facts.kbit_prepared = (_truth(switch) is not False, f"{callee}(" + ", ".join(
                f"{k}={_shown(v)}" for k, v in keywords.items()) + ")")
        if callee == "ScalingConfig" and "num_workers" in keywords:
            workers = evaluate(keywords["num_workers"])
            gpu = evaluate(keywords["use_gpu"]) if "use_gpu" in keywords else False
            per_worker = evaluate(keywords["resources_per_worker"]) if "resources_per_worker" in keywords else {}
            wants_gpu = gpu is True or (isinstance(per_worker, dict) and bool(per_worker.get("GPU")))
            if isinstance(workers, int) and not isinstance(workers, bool) and workers > 0 and wants_gpu:
                facts.workers = workers
    if len(models) == 1:
        facts.model = models.pop()
    if len(trl_commands) == 1:
        facts.trl_command = trl_commands.pop()
    if len(tasks) == 1:
        facts.task = tasks.pop()
    facts.calls = _training_calls(tree, calls, evaluate)
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == "zero_optimization"
                                              for k in node.keys):
            config = evaluate(node)
            if isinstance(config, dict) and isinstance(config.get("zero_optimization"), dict):
                facts.deepspeed = config
                break
    return facts


def _truth(value: Any) -> bool | None:
    """A resolved value's truth as an ``if`` tests it (flag values arrive as text: "false" is false); None: unknown."""
    if value is _UNRESOLVED:
        return None
    if isinstance(value, str):
        return value.strip().lower() not in ("", "false", "0", "no", "none", "off")
    return bool(value)


def _runs(node: ast.AST, parents: Mapping[ast.AST, ast.AST], evaluate: Any) -> bool:
    """Whether the code at ``node`` runs, as far as the ``if`` tests around it resolve (unknown tests: it runs)."""
    child, parent = node, parents.get(node)
    while parent is not None:
        if isinstance(parent, ast.If):
            test = parent.test
            negate = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
            truth = _truth(evaluate(test.operand if negate else test))
            if truth is not None:
                truth = truth != negate
                if (child in parent.body and not truth) or (child in parent.orelse and truth):
                    return False
        child, parent = parent, parents.get(parent)
    return True


def call_parts(call: ast.Call) -> tuple[str, str, dict[str, ast.AST]]:
    """(callee, owner, keywords) of a call: ``Owner.callee(k=v)``, or of the call an mmengine-style config describes
    as ``dict(type=Owner.callee, k=v)`` (xtuner, mmengine: the runner makes that call), its ``type`` left out."""
    keywords = {k.arg: k.value for k in call.keywords if k.arg}
    target = keywords.get("type") if isinstance(call.func, ast.Name) and call.func.id == "dict" else None
    if target is not None and isinstance(target, (ast.Name, ast.Attribute)):
        del keywords["type"]
        return _name(target), _name(target.value) if isinstance(target, ast.Attribute) else "", keywords
    owner = _name(call.func.value) if isinstance(call.func, ast.Attribute) else ""
    return _name(call.func), owner, keywords


def _shown(node: ast.AST) -> str:
    """A keyword's expression as the script writes it (``args.batch``, ``max_seq_length``), shortened."""
    try:
        text = ast.unparse(node)
    except (RecursionError, ValueError):
        return "..."
    return text if len(text) <= 48 else text[:45] + "..."


def _flag_value(value: Any) -> Any:
    """A keyword's resolved value as a flag's: lists of names comma-joined, anything else as it is."""
    if isinstance(value, list):
        return ",".join(str(v) for v in value) if value and all(isinstance(v, str) for v in value) else _UNRESOLVED
    return value if isinstance(value, (str, int, float, bool)) else _UNRESOLVED


def _training_calls(tree: ast.Module, calls: Sequence[ast.Call], evaluate: Any) -> list[tuple[str, Any, str]]:
    """The training calls' keyword arguments as (flag, value, where) (see the module's docstring)."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found: list[tuple[str, Any, str]] = []
    seen: set[str] = set()
    sft = loaded = loader = False

    def resolve(node: ast.AST) -> Any:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch":
            return node.attr  # torch.bfloat16
        if isinstance(node, ast.Call) and _name(node.func) == "is_bfloat16_supported":
            return True  # Unsloth's bf16=is_bfloat16_supported(): bf16 on the GPUs that have it (Ampere and later)
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [evaluate(item) for item in node.elts]
            return _UNRESOLVED if any(i is _UNRESOLVED for i in items) else items
        return evaluate(node)

    def add(flag: str, value: Any, where: str) -> None:
        value = _flag_value(value)
        if value is not _UNRESOLVED and flag not in seen and len(found) < _MAX_CALL_VALUES:
            seen.add(flag)
            found.append((flag, value, where))

    for call in calls:
        callee, owner, keywords = call_parts(call)
        unsloth_peft = callee == "get_peft_model" and owner.startswith("Fast")
        relevant = (callee in _ARGUMENT_CLASSES or callee in _TRAINER_CLASSES or callee in ("LoraConfig",
                    "BitsAndBytesConfig", "gradient_checkpointing_enable", "DataLoader") or unsloth_peft
                    or callee == "from_pretrained")
        if not relevant or not _runs(call, parents, evaluate):
            continue
        if callee in _ARGUMENT_CLASSES:
            for key, node in keywords.items():
                add(key.lower(), resolve(node), f"{callee}({key}={_shown(node)})")
        elif callee in _TRAINER_CLASSES:
            sft |= callee in ("SFTTrainer", "UnslothTrainer")
            for key in _TRAINER_KEYWORDS:
                if key in keywords:
                    add(key, resolve(keywords[key]), f"{callee}({key}={_shown(keywords[key])})")
        elif callee == "LoraConfig" or unsloth_peft:
            what = f"{owner}.get_peft_model" if unsloth_peft else "LoraConfig"
            add("use_peft", True, f"{what}(...)")  # an adapter whatever the command's switches say
            given_or_default = {**(_UNSLOTH_PEFT_DEFAULTS if unsloth_peft else _PEFT_LORA_DEFAULTS),
                                **{k: resolve(v) for k, v in keywords.items()}}
            for key, flag in _LORA_KEYWORDS.items():
                if key in given_or_default:
                    shown = _shown(keywords[key]) if key in keywords else f"{given_or_default[key]!r} default"
                    add(flag, given_or_default[key], f"{what}({key}={shown})")
            if unsloth_peft and (checkpointing := given_or_default.get("use_gradient_checkpointing")) is not None:
                stated = "" if "use_gradient_checkpointing" in keywords else " default"
                where = f"{what}(use_gradient_checkpointing={checkpointing!r}){stated}"
                offloaded = str(checkpointing).strip().lower() == "unsloth"
                add("gradient_checkpointing", offloaded or _truth(checkpointing) is True, where)
                if offloaded:  # Unsloth's checkpointing keeps the checkpointed inputs in host memory
                    add("activation_offloading", True, where)
        elif callee == "BitsAndBytesConfig":
            for key in _BNB_KEYWORDS:
                if key in keywords:
                    add(key, resolve(keywords[key]), f"BitsAndBytesConfig({key}={_shown(keywords[key])})")
        elif callee == "DataLoader" and "batch_size" in keywords and not loader:
            # a plain PyTorch loop's first DataLoader (the training one, as scripts write it first): its batch
            loader = True
            add("per_device_train_batch_size", resolve(keywords["batch_size"]),
                f"DataLoader(batch_size={_shown(keywords['batch_size'])})")
        elif callee == "gradient_checkpointing_enable":
            add("gradient_checkpointing", True, f"{owner or 'model'}.gradient_checkpointing_enable()")
        elif callee == "from_pretrained" and (owner.startswith(("AutoModel", "Fast"))
                                              or owner.endswith(("ForCausalLM", "LMHeadModel"))) and not loaded:
            # the first model load is the one that trains (a later reload, e.g. in fp16 to merge the adapter after
            # training, is not)
            loaded = True
            for key in _LOAD_KEYWORDS:
                if key in keywords:
                    add("torch_dtype" if key == "dtype" else key, resolve(keywords[key]),
                        f"{owner}.from_pretrained({key}={_shown(keywords[key])})")
            if owner.startswith("Fast") and "load_in_4bit" not in keywords:
                add("load_in_4bit", True, f"{owner}.from_pretrained (load_in_4bit default True)")
    if "max_seq_length" not in seen and (cut := _truncation_length(tree, evaluate)) is not None:
        add("max_seq_length", cut[0], f"{cut[1]} (the script truncates its samples there)")
    if sft and not seen & {"max_seq_length", "max_length"}:
        # TRL's SFTTrainer truncates at 1024 tokens when no length is given (SFTConfig max_length 1024; before it,
        # min(tokenizer.model_max_length, 1024) in SFTTrainer)
        add("max_seq_length", 1024, "SFTTrainer default (TRL: 1024 tokens when no length is given)")
    return found


def module_assignments(source: str) -> dict[str, Any] | None:
    """A config module's top-level ``NAME = VALUE`` assignments (mmengine-style configs: ``batch_size = 1``,
    ``pack_to_max_length = True``, ``optim_type = PagedAdamW32bit``): literals and booleans as they are, a name or
    an attribute as its last part (``"PagedAdamW32bit"``); None when the text is no Python this can parse."""
    tree = _parse(source)
    if tree is None:
        return None
    out: dict[str, Any] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        value = _literal(node.value)
        if value is _UNRESOLVED and isinstance(node.value, ast.Constant) and isinstance(node.value.value, bool):
            value = node.value.value
        if value is _UNRESOLVED and isinstance(node.value, (ast.Name, ast.Attribute)):
            value = _name(node.value)
        if value is not _UNRESOLVED:
            out[node.targets[0].id] = value
    return out


_LENGTH_NAME = re.compile(r"(?i)^max_?(?:seq_?|source_?|input_?)?_?len(?:gth)?$")


def _truncation_length(tree: ast.Module, evaluate: Any) -> tuple[int, str] | None:
    """A tokenize function's own cut, ``input_ids[:MAX_LENGTH]`` with ``MAX_LENGTH = 384`` (self-llm's and many
    tutorials' process_func): the length every sample is truncated to, when the script slices at one such length
    only."""
    found: set[tuple[int, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice) and node.slice.lower is None \
                and node.slice.step is None and isinstance(node.slice.upper, ast.Name) \
                and _LENGTH_NAME.match(node.slice.upper.id):
            value = evaluate(node.slice.upper)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                found.add((value, f"[:{node.slice.upper.id}] with {node.slice.upper.id} = {value}"))
        if len(found) > 1:
            return None
    return next(iter(found)) if found else None


def _single_assignments(tree: ast.Module) -> dict[str, ast.AST]:
    """The value expression of each name the script assigns exactly once (``NAME = EXPR``, any scope)."""
    found: dict[str, list[ast.AST]] = {}
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign | ast.AugAssign | ast.For) else []
        for target in targets:
            for name in (n for n in ast.walk(target) if isinstance(n, ast.Name)):
                value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) and len(targets) == 1 \
                    and isinstance(target, ast.Name) and node.value is not None else None
                found.setdefault(name.id, []).append(value if value is not None else ast.Pass())
    return {name: values[0] for name, values in found.items() if len(values) == 1
            and not isinstance(values[0], ast.Pass)}


def _dict_literals(tree: ast.Module) -> dict[str, dict[str, Any]]:
    """``NAME = {"key": LITERAL, ...}`` anywhere in the script, for a name assigned one such dict only: its literal
    entries (``config = {"lr": 2e-5, "batch_size": 16}``)."""
    found: dict[str, list[dict[str, Any] | None]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            table: dict[str, Any] | None = None
            if isinstance(node.value, ast.Dict):
                table = {k.value: v for k, v in ((key, _constant(value)) for key, value in
                                                 zip(node.value.keys, node.value.values, strict=True))
                         if isinstance(k, ast.Constant) and isinstance(k.value, str) and v is not _UNRESOLVED}
            found.setdefault(node.targets[0].id, []).append(table)
    return {name: tables[0] for name, tables in found.items() if len(tables) == 1 and tables[0] is not None}


def _module_constants(tree: ast.Module) -> dict[str, Any]:
    """``NAME = LITERAL`` assignments (``MODEL_ID = "Qwen/Qwen2.5-7B"``, ``use_4bit = True``): the module's own, then
    names assigned inside functions (PEFT's examples set ``model_name_or_path = "..."`` in ``main()``) when every
    assignment to that name in the file is the same literal."""
    out: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = _constant(node.value)
            if value is not _UNRESOLVED:
                out[node.targets[0].id] = value
    seen: dict[str, set[Any]] = {}
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign | ast.AugAssign) else []
        for target in targets:
            if isinstance(target, ast.Name):
                value = _constant(node.value) if isinstance(node, ast.Assign | ast.AnnAssign) and \
                    node.value is not None and len(targets) == 1 else _UNRESOLVED
                seen.setdefault(target.id, set()).add(value if value is _UNRESOLVED else (type(value), value))
    for name, values in seen.items():
        if name not in out and len(values) == 1 and _UNRESOLVED not in values:
            out[name] = next(iter(values))[1]
    return out


def _constant(node: ast.AST) -> Any:
    """A literal (a string or a number) or a boolean constant; _UNRESOLVED otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, bool):
        return node.value
    return _literal(node)


def default_flags(facts: ScriptFacts, given: Sequence[str]) -> list[str]:
    """``--name value`` words for the script's defaults the command does not pass itself."""
    words: list[str] = []
    for name, value in facts.defaults:
        if name not in given:
            words += [f"--{name}", str(value)]
    return words
