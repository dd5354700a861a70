"""Pools config: strict schema, errors with paths (all at once), the embedded default."""

from __future__ import annotations

from typing import Any

import pytest

from predictors.errors import SpecError
from scheduler.pools import default_pools, load_pools, parse_pools, parse_pools_text


def _pool(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": "a100", "gpu": "A100-80GB", "gpus_per_node": 8, "nodes": 2,
                            "price_usd_per_gpu_hour": 1.83}
    base.update(kw)
    return base


def _paths(data: Any) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_pools(data, "pools.yaml")
    return [p.path for p in info.value.problems]


def test_default_pools_are_the_four_cited_types() -> None:
    cfg = default_pools()
    assert [p.gpu for p in cfg.pools] == ["L40S", "A100-80GB", "H100-80GB", "B200"]
    assert all(p.price_source and p.price_usd_per_gpu_hour > 0 for p in cfg.pools)
    assert all(p.node_selector and p.tolerations for p in cfg.pools)


def test_gpu_alias_is_canonicalised_and_links_follow_overrides() -> None:
    cfg = parse_pools({"pools": [_pool(gpu="h100", interconnect={"inter_node_bytes_per_second": 1e10})]})
    pool = cfg.pools[0]
    assert pool.gpu == "H100-80GB"
    assert pool.links.inter_node_bytes_per_second == 1e10 and pool.links.gpus_per_node == 8
    assert pool.total_gpus == 16 and pool.nodes_for(9) == 2


@pytest.mark.parametrize(("pools", "path"), [
    ([_pool(), _pool(name="b"), _pool(name="c", price_usd_per_gpu_hour=-1)], "pools[2].price_usd_per_gpu_hour"),
    ([_pool(gpu="Z9000")], "pools[0].gpu"),
    ([_pool(colour="red")], "pools[0].colour"),
    ([_pool(free_gpus=17)], "pools[0]"),
    ([_pool(name="Bad_Name")], "pools[0].name"),
    ([_pool(tolerations=[{"key": "k", "operator": "Maybe"}])], "pools[0].tolerations[0].operator"),
    ([_pool(interconnect={"nvlink": 1})], "pools[0].interconnect.nvlink"),
    ([_pool(), _pool()], ""),
    # YAML booleans where a number belongs were read as 1 / 0
    ([_pool(gpus_per_node=True)], "pools[0].gpus_per_node"),
    ([_pool(price_usd_per_gpu_hour=True)], "pools[0].price_usd_per_gpu_hour"),
    ([_pool(free_gpus=False)], "pools[0].free_gpus"),
    # tolerations the Kubernetes API server rejects on every pod placed there
    ([_pool(tolerations=[{"operator": "Equal", "value": "x"}])], "pools[0].tolerations[0]"),
    ([_pool(tolerations=[{"key": "k", "operator": "Exists", "value": "v"}])], "pools[0].tolerations[0]"),
    # a link speed far below any GPU network: a unit slip (400 meant as 400 Gb/s)
    ([_pool(interconnect={"inter_node_bytes_per_second": 400})], "pools[0].interconnect.inter_node_bytes_per_second"),
])
def test_errors_carry_paths(pools: list[dict[str, Any]], path: str) -> None:
    assert path in _paths({"pools": pools})


def test_all_errors_are_reported_at_once() -> None:
    paths = _paths({"pools": [_pool(nodes=0), _pool(name="x", gpus_per_node="many")], "extra": 1})
    assert {"pools[0].nodes", "pools[1].gpus_per_node", "extra"} <= set(paths)


def test_missing_fields_and_bad_files() -> None:
    assert "pools[0].price_usd_per_gpu_hour" in _paths({"pools": [{"name": "a", "gpu": "L40S", "gpus_per_node": 1,
                                                                   "nodes": 1}]})
    with pytest.raises(SpecError, match="valid YAML"):
        parse_pools_text("pools: [", "p.yaml")
    with pytest.raises(SpecError, match="cannot read pools file"):
        load_pools("/nonexistent/pools.yaml")
    with pytest.raises(SpecError, match="mapping"):
        parse_pools([1, 2])


def test_audit_rejections_say_what_to_write() -> None:
    with pytest.raises(SpecError) as info:
        parse_pools({"pools": [_pool(interconnect={"intra_node_bytes_per_second": 25})]}, "pools.yaml")
    assert "bytes per second" in str(info.value) and "50e9" in str(info.value)
    assert _paths({"pools": [_pool()], "headroom_fraction": False}) == ["headroom_fraction"]
    with pytest.raises(SpecError, match="must be Exists"):
        parse_pools({"pools": [_pool(tolerations=[{"effect": "NoSchedule"}])]})


def test_valid_tolerations_and_links_still_parse() -> None:
    cfg = parse_pools({"pools": [_pool(tolerations=[{"operator": "Exists"}, {"key": "k", "value": "v"},
                                                    {"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
                                       interconnect={"inter_node_bytes_per_second": 1.25e9})]})
    assert len(cfg.pools[0].tolerations) == 3


def test_a_pool_name_longer_than_a_kubernetes_label_value_is_refused() -> None:
    """The webhook writes the pool name as a label value (Kueue flavor / vramfit.io/pool); the API server refuses
    values over 63 characters, so a 64-character name gave patches that could never be applied."""
    assert parse_pools({"pools": [_pool(name="a" * 63)]}).pools[0].name == "a" * 63
    with pytest.raises(SpecError) as info:
        parse_pools({"pools": [_pool(name="a" * 64)]}, "pools.yaml")
    [problem] = info.value.problems
    assert problem.path == "pools[0].name"
    assert "at most 63 characters" in problem.message and "not 64" in problem.message
    assert problem.message.count("got ") == 1  # the input is quoted once


@pytest.mark.parametrize("nodes", [10**6 + 1, 10**100, 10**400], ids=["1e6+1", "1e100", "1e400"])
def test_a_node_count_beyond_any_cluster_is_an_error_naming_it(nodes: int) -> None:
    """Placement tries GPU counts up to nodes x gpus_per_node: a pool of 10**400 nodes was an OverflowError traceback
    from `vramfit place` (the per-GPU terms divide by the count), and 10**4000 nodes kept `gpus: auto` walking counts
    for tens of seconds. A pool holds at most a million nodes; a million still parses."""
    assert "pools[0].nodes" in _paths({"pools": [_pool(nodes=nodes)]})
    assert parse_pools({"pools": [_pool(nodes=10**6)]}).pools[0].total_gpus == 8 * 10**6
