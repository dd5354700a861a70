"""The alias cap on user YAML: a "billion laughs" document is refused before anything walks it; ordinary
anchors, large alias-free documents and deep nesting keep their old outcomes."""

from __future__ import annotations

import pytest
import yaml

from predictors.errors import SpecError
from scheduler.spec import read_jobs_text
from scheduler.spec.yamltext import (
    MAX_ALIAS_NODES,
    MAX_EMBEDDED_CHARS,
    AliasExpansionError,
    TextBudget,
    alias_expansion,
    safe_load,
    safe_load_all,
    too_long,
    yaml_error_text,
)


def laughs(levels: int, width: int = 10, indent: str = "") -> str:
    """Anchors ``l0..l{levels-1}``: a list of ``width`` scalars, then lists of ``width`` aliases to the one
    before. The last stands for ``width ** levels`` scalars."""
    lines = [f"{indent}l0: &l0 [{', '.join(['x'] * width)}]"]
    lines += [f"{indent}l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_a_billion_laughs_document_is_refused_with_its_line() -> None:
    with pytest.raises(AliasExpansionError, match=r"more than 100,000 nodes .*anchor at line \d+"):
        safe_load(laughs(9))
    assert yaml.safe_load(laughs(9))["l8"][0][0] is not None  # plain PyYAML builds it (as shared references)


def test_the_cap_counts_what_aliases_add() -> None:
    # l1 adds 10 copies of l0 (11 nodes each): 110; l2 adds 10 copies of l1 (111 nodes each): 1,110.
    assert alias_expansion(yaml.compose(laughs(3))) == 110 + 1110
    assert alias_expansion(yaml.compose(laughs(2)), limit=110) == 110
    with pytest.raises(AliasExpansionError):
        alias_expansion(yaml.compose(laughs(2)), limit=109)


def test_a_document_without_aliases_is_not_capped_by_its_size() -> None:
    # About 2,000 nodes against a cap of 10: only alias uses count, so nothing is added and nothing refused.
    text = "items:\n" + "".join(f"  - {{name: n{i}, value: {i}}}\n" for i in range(400))
    assert alias_expansion(yaml.compose(text), limit=10) == 0
    assert len(safe_load(text)["items"]) == 400


def test_ordinary_anchors_are_read_as_before() -> None:
    text = """
base: &res {limits: {nvidia.com/gpu: 8, memory: 512Gi}}
env: &env [{name: A, value: "1"}, {name: B, value: "2"}]
master: {resources: *res, env: *env}
worker: {resources: *res, env: *env}
merged: {<<: *res, extra: true}
"""
    assert safe_load(text) == yaml.safe_load(text)
    assert safe_load_all(text + "---\n" + text) == list(yaml.safe_load_all(text + "---\n" + text))


def test_a_recursive_anchor_is_refused() -> None:
    with pytest.raises(AliasExpansionError, match="used inside itself"):
        safe_load("a: &a [1, *a]\n")
    with pytest.raises(AliasExpansionError, match="used inside itself"):
        safe_load("a: &a {b: {c: *a}}\n")


def test_every_document_of_a_stream_is_checked() -> None:
    with pytest.raises(AliasExpansionError):
        safe_load_all("model: llama-3.1-8b\n---\n" + laughs(9))


def test_the_error_text_says_refused_not_invalid_syntax() -> None:
    with pytest.raises(AliasExpansionError) as caught:
        safe_load(laughs(8))
    assert yaml_error_text(caught.value).startswith(f"is refused: its aliases expand to more than {MAX_ALIAS_NODES:,}")


def test_a_spec_file_with_a_bomb_in_its_model_config_is_a_clear_error() -> None:
    config = ("model:\n  config:\n    model_type: llama\n    hidden_size: 256\n    num_hidden_layers: 2\n"
              "    num_attention_heads: 4\n    intermediate_size: 512\n    vocab_size: 1000\n"
              + laughs(9, indent="    "))
    with pytest.raises(SpecError) as caught:
        read_jobs_text(config, source="bomb.yaml")
    text = caught.value.render()
    assert "bomb.yaml" in text and "aliases expand to more than" in text


def test_too_long_names_the_size_and_the_cap() -> None:
    assert too_long("x" * MAX_EMBEDDED_CHARS) is None
    assert too_long("x" * (MAX_EMBEDDED_CHARS + 1)) == (
        "is 65,537 characters long; vramfit reads at most 65,536 (64 KiB) here")
    assert too_long("x" * 10, limit=8) == "is 10 characters long; vramfit reads at most 8 (0.0078125 KiB) here"


def test_a_text_budget_caps_each_field_and_the_job() -> None:
    budget = TextBudget(total=100)
    assert budget.refuse("x" * 60, "a") is None and budget.left == 40
    assert budget.refuse("x" * 50, "b") == ("b is 50 characters long, past the 100 characters of scripts and "
                                            "configs that vramfit reads of one job; it was not read")
    assert budget.refuse("x" * 40, "c") is None and budget.left == 0 and len(budget.notes) == 1
    long = "x" * (MAX_EMBEDDED_CHARS + 1)
    assert TextBudget().refuse(long, "d") == f"d {too_long(long)}; it was not read"


def test_an_integer_too_long_for_python_is_a_yaml_error_with_its_line() -> None:
    with pytest.raises(yaml.YAMLError) as caught:
        safe_load("model: llama-3.2-1b\nseq_len: " + "9" * 5_000 + "\n")
    assert yaml_error_text(caught.value) == ("is not valid YAML at line 2, column 10: an integer of 5,000 characters "
                                             "is too long (at most 4,300 digits)")
    assert safe_load("a: 0x" + "f" * 5_000)["a"] == 16**5_000 - 1  # powers of two are not limited by Python
    assert safe_load("a: -1_000\nb: 017\nc: 190:20:30") == {"a": -1000, "b": 15, "c": 685230}  # YAML 1.1 forms


def test_a_key_written_twice_is_refused_with_both_lines() -> None:
    with pytest.raises(yaml.YAMLError) as caught:
        safe_load("model: llama-3.1-8b\nmethod: lora\nmodel: llama-2-7b\n")
    assert "the key 'model' is written twice in one mapping (first on line 1)" in str(caught.value)
    assert "line 3" in str(caught.value)
    # a merge key's values are not duplicates: the mapping's own keys override them, as YAML defines
    assert safe_load("a: &x {b: 1, c: 2}\nd:\n  <<: *x\n  b: 3\n")["d"] == {"b": 3, "c": 2}
    assert safe_load("1: a\n'1': b\n") == {1: "a", "1": "b"}  # an int key and a str key are two keys


def test_merge_keys_nested_deeper_than_their_users_are_not_duplicates() -> None:
    # PyYAML flattens `x` when `y` merges it, before `x` itself is built: checked on the parsed tree instead
    text = "a: &a {k: 1, m: 3}\ndefaults:\n  level1:\n    level2: &x\n      <<: *a\n      k: 2\ny:\n  <<: *x\n"
    assert safe_load(text)["defaults"]["level1"]["level2"] == {"k": 2, "m": 3}


def test_trainer_configs_keep_the_last_of_a_repeated_key_as_their_trainers_do() -> None:
    assert safe_load("base_model: a\nbase_model: b\n", unique_keys=False) == {"base_model": "b"}
