"""Real manifests with fields swapped for values of the wrong type: every parser answers with a SpecError (or
"not a training job"), never another exception, and what it does parse can be placed.

A seeded, deterministic mutation sweep over the shared upstream fixtures and our example jobs; it found a
TrainJob runtime patch whose ``replicatedJobs[].template`` was a string crashing with AttributeError.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from predictors.errors import SpecError
from scheduler.placement import place
from scheduler.pools import default_pools
from scheduler.spec.document import NoTrainingJob
from scheduler.spec.registry import parse_object
from tests.scheduler.spec.helpers import FIXTURES

EXAMPLE_JOBS = Path(__file__).resolve().parents[3] / "examples" / "jobs"
# values of every JSON/YAML type, and a few that are valid for some fields and wrong for others
WRONG_VALUES: tuple[Any, ...] = (None, [], {}, 0, -1, 1.5, "", "x", True, 10**30, [1, None], {"a": None},
                                 "1e400", "auto", "nvidia.com/gpu")


def _documents() -> list[tuple[str, dict[str, Any]]]:
    files = sorted(EXAMPLE_JOBS.glob("*.yaml"))
    if FIXTURES is not None:
        files += sorted(FIXTURES.glob("*.yaml"))
    docs = []
    for path in files:
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if isinstance(doc, dict):
                docs.append((path.name, doc))
    return docs


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if prefix:
        yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, (*prefix, i))


def _set(node: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


DOCS = _documents()


@pytest.mark.parametrize("seed", range(4))
def test_mutated_manifests_get_a_spec_error_or_a_placeable_job(seed: int) -> None:
    rng = random.Random(seed)
    pools = default_pools()
    placed = 0
    for _ in range(150):
        name, original = rng.choice(DOCS)
        doc = copy.deepcopy(original)
        for _ in range(rng.randint(1, 3)):
            paths = list(_paths(doc))
            if not paths:
                break
            _set(doc, rng.choice(paths), copy.deepcopy(rng.choice(WRONG_VALUES)))
        try:
            job = parse_object(doc, name, None)
        except (SpecError, NoTrainingJob):
            continue
        except Exception as exc:  # the assertion names the input, which a bare traceback would not
            pytest.fail(f"{name} mutated to {doc!r:.2000} raised {type(exc).__name__}: {exc}")
        for parsed in job if isinstance(job, list) else [job]:
            if getattr(parsed, "spec", None) is not None:
                place(parsed.spec, pools, suggest=False)
                placed += 1
    # most mutations are refused with a SpecError, as they should be; some must still get through to placement
    assert placed >= 3, f"only {placed} of 150 mutated manifests reached placement: the fuzz tests too little"


def test_a_runtime_patch_whose_job_template_is_not_a_mapping_is_not_a_crash() -> None:
    doc: dict[str, Any] = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "t"},
        "spec": {"runtimeRef": {"name": "torch-distributed"},
                 "trainer": {"image": "x", "command": ["python", "train.py", "--model_name_or_path", "gpt2"],
                             "resourcesPerNode": {"limits": {"nvidia.com/gpu": 1}}},
                 "runtimePatches": [{"manager": "m", "trainingRuntimeSpec": {"template": {"spec": {
                     "replicatedJobs": [{"name": "node", "template": "not a mapping"}]}}}}]},
    }
    job = parse_object(doc, "t.yaml", None)  # the patch pins no GPU; the trainer itself still parses
    assert not isinstance(job, list) and job.spec is not None
    assert (job.spec.model, job.spec.gpus, job.spec.gpu) == ("gpt2", 1, None)
