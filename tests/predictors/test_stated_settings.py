"""The extensions' what-if guard: the dev runs predicted with the settings their sources state
(``bench/data/stated_settings.yaml``, run by ``python bench/stated_settings.py``) must not get worse, and the file
must keep naming real runs with valid extension fields."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from predictors.evaluation import Evaluation

REPO = Path(__file__).resolve().parents[2]

# measured 2026-11-26: the 52 rows of torchtune and PEFT settings (all torchtune rows with framework torchtune) 33.7 % /
# 91.5 % (v1 specs) -> 8.4 % / 32.5 %. 2026-11-27, with the 24 S14 Q-LoRA rows' DeepSpeed bucket (reduce_bucket_size
# 2e8, overlap_comm) named as well: 76 rows 23.3 % / 59.2 % -> 7.7 % / 25.1 %; all 193 dev rows 11.4 % / 41.6 % ->
# 8.1 % / 24.1 %, no source's median above 20 % but S12 (torchtitan's float8, 25.0 %) and S15 (20.9 %: its median row
# is the full fp32 T0 run, unchanged; its ZeRO-3 T0 LoRA row moved above it, +7.7 % -> +28.0 %, when the fp32 gradient
# bucket of DeepSpeed's default 5e8 elements was counted, while its mt0 and BLOOMZ ZeRO-3 rows moved closer, -19 % ->
# -10 % and -51 % -> -40 %). 2026-11-27 (session 29), torchtitan's compiled whole-batch loss read as the fused kernel it
# is: S12 25.0 % -> 2.7 %, 76 rows 7.1 % / 24.8 %, all 193 rows 8.0 % / 23.2 %
NAMED_MEDIAN_LIMIT, NAMED_P90_LIMIT = 0.072, 0.249
ALL_MEDIAN_LIMIT, ALL_P90_LIMIT = 0.081, 0.233


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("stated_settings", REPO / "bench" / "stated_settings.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stated_settings_improve_the_rows_that_state_them(dev_runs_path: Path) -> None:
    bench = _bench()
    v1, stated, ids = bench.both(dev_runs_path)
    named = Evaluation([r for r in stated.results if r.run.id in ids]).summary()
    assert named["n"] == len(ids) == 76
    assert named["median_ape"] <= NAMED_MEDIAN_LIMIT and named["p90_ape"] <= NAMED_P90_LIMIT, named
    settings = yaml.safe_load((REPO / "bench" / "data" / "stated_settings.yaml").read_text())
    bucket = {i for i, fields in settings.items() if "zero_reduce_bucket_elements" in fields}
    assert len(bucket) == 24
    # the torchtune and PEFT settings take their rows' error down 4x
    after = Evaluation([r for r in stated.results if r.run.id in ids - bucket]).summary()["median_ape"]
    before = Evaluation([r for r in v1.results if r.run.id in ids - bucket]).summary()["median_ape"]
    assert after < before / 4, (after, before)
    # the stated bucket, 2 x 2e8 16-bit elements, is 0.2 GB below DeepSpeed's default one of 5e8 (their median error
    # 5.3 % -> 6.4 %: these rows sit under the analytic peak by more than the bucket)
    v1_bytes = {r.run.id: r.predicted_bytes for r in v1.results}
    for r in stated.results:
        if r.run.id in bucket:
            assert v1_bytes[r.run.id] - r.predicted_bytes == pytest.approx(0.2e9, rel=0.1), r.run.id
    whole = stated.summary()
    assert whole["median_ape"] <= ALL_MEDIAN_LIMIT and whole["p90_ape"] <= ALL_P90_LIMIT, whole
    over = {source: st["median_ape"] for source, st in stated.by(lambda r: r.run.source).items()
            if st["median_ape"] > 0.20}
    assert set(over) <= {"S12", "S15"}, over
    # rows the file does not name are predicted exactly as before
    before = {r.run.id: r.predicted_bytes for r in v1.results}
    assert all(r.predicted_bytes == before[r.run.id] for r in stated.results if r.run.id not in ids)


def test_settings_file_errors_name_the_problem(tmp_path: Path, dev_runs_path: Path) -> None:
    bench = _bench()
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("S99-001: {torch_compile: true}\n")
    with pytest.raises(SystemExit, match="S99-001"):
        bench.both(dev_runs_path, unknown)
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text("S02-011: {cross_entropy: sampled}\n")
    with pytest.raises(Exception, match=r"S02-011\.spec\.cross_entropy"):
        bench.both(dev_runs_path, invalid)
