"""Bad files and flags of the commands end in a message that names the flag and what is wrong, with exit code 2,
never a traceback; output locations are checked before the work; periods that would busy-loop are refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.cli import main
from scheduler.cli.server_common import package_version

REPO = Path(__file__).resolve().parents[3]
BINARY = bytes(range(256)) * 2  # not UTF-8 text: 0x80 cannot start a character


@pytest.fixture
def binary(tmp_path: Path) -> Path:
    path = tmp_path / "binary.yaml"
    path.write_bytes(BINARY)
    return path


@pytest.fixture
def not_a_folder(tmp_path: Path) -> Path:
    """A path under a regular file: no folder can be created there (whoever runs the tests, root included)."""
    (tmp_path / "file").write_text("x")
    return tmp_path / "file" / "sub"


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """``vramfit ARGV`` in a process of its own (``serve`` sets up logging and the server for the process)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "scheduler.cli", *argv], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


def assert_input_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err


@pytest.mark.parametrize("argv", [
    ["evaluate", "--runs", "{binary}"],
    ["simulate", "--jobs", "{binary}", "--no-plots", "--no-progress"],
    ["simulate", "--runs", "{binary}", "--no-plots", "--no-progress"],
    ["calibrate", "--sweep", "{binary}", "--list"],
])
def test_a_file_that_is_not_text_is_an_input_error(argv: list[str], binary: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    flag = argv[argv.index("{binary}") - 1]
    code = main([str(binary) if a == "{binary}" else a for a in argv])
    assert_input_error(code, capsys.readouterr().err, f"`{flag}` cannot read", str(binary), "can't decode")


@pytest.mark.parametrize("argv", [
    ["place", str(REPO / "examples" / "llama-3.1-8b-lora.yaml"), "--pools", "{binary}"],
    ["simulate", "--pools", "{binary}", "--no-plots", "--no-progress"],
])
def test_a_pools_file_that_is_not_text_is_an_input_error(argv: list[str], binary: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    code = main([str(binary) if a == "{binary}" else a for a in argv])
    assert_input_error(code, capsys.readouterr().err, f"cannot read pools file {binary}: not UTF-8 text")


@pytest.mark.parametrize("flag", ["--pools", "--settings", "--token-file"])
def test_serve_reports_unreadable_files(flag: str, binary: Path) -> None:
    proc = run_cli("serve", "--port", "0", flag, str(binary))
    wanted = f"cannot read pools file {binary}" if flag == "--pools" else f"`{flag}` cannot read"
    assert_input_error(proc.returncode, proc.stderr, wanted, str(binary))


def test_serve_reports_a_missing_token_file(tmp_path: Path) -> None:
    proc = run_cli("serve", "--port", "0", "--token-file", str(tmp_path / "nonexistent"))
    assert_input_error(proc.returncode, proc.stderr, "`--token-file` cannot read the token file",
                       "No such file or directory")


def test_serve_settings_unknown_fields_list_the_admission_settings(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text((REPO / "examples" / "llama-3.1-8b-lora.yaml").read_text())
    proc = run_cli("serve", "--port", "0", "--settings", str(spec))
    assert_input_error(proc.returncode, proc.stderr, "`settings.model` is not a known field",
                       "known fields: annotation_prefix, failure_mode")
    assert "micro_batch_size, model" not in proc.stderr  # not the TrainingSpec's fields


def test_calibrate_sweep_unknown_fields_list_the_sweep_fields(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("name: x\nfoo: 1\nbase: {model: gpt2}\nconfigs: [{}]\n")
    assert_input_error(main(["calibrate", "--sweep", str(sweep), "--list"]), capsys.readouterr().err,
                       "`foo` is not a known field", "known fields: base, configs, description, grids")


def test_simulate_refuses_a_negative_seed(capsys: pytest.CaptureFixture[str]) -> None:
    assert_input_error(main(["simulate", "--seed", "-1", "--no-plots"]), capsys.readouterr().err,
                       "`--seed` must be a non-negative integer; got -1")


def test_simulate_checks_out_before_simulating(not_a_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import scheduler.cli.simulate as simulate_cli

    def no_work(*args: object) -> None:
        raise AssertionError("the scenario was built before --out was checked")

    monkeypatch.setattr(simulate_cli, "build_scenario", no_work)
    assert_input_error(main(["simulate", "--out", str(not_a_folder)]), capsys.readouterr().err,
                       "`--out` cannot create the folder", str(not_a_folder))
    assert_input_error(main(["simulate", "--out", str(tmp_path / "file")]), capsys.readouterr().err,
                       "`--out`", "is a file, not a folder")


@pytest.mark.parametrize("flag", ["--out", "--runtime-out"])
def test_train_checks_its_outputs_before_fitting(flag: str, not_a_folder: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import predictors.residual_build

    def no_fit(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was fitted before the outputs were checked")

    monkeypatch.setattr(predictors.residual_build, "train", no_fit)
    runs = tmp_path / "runs.jsonl"
    runs.write_text("")
    fine = ["--out", str(tmp_path / "m.skops")] if flag == "--runtime-out" else []
    for bad, message in ((not_a_folder / "m.skops", "cannot create the folder"),
                         (tmp_path, "is a folder, not a file")):  # it wrote `<folder>.tmp` beside it, then crashed
        argv = ["train", "--runs", str(runs), *fine, flag, str(bad), "--no-cv"]
        assert_input_error(main(argv), capsys.readouterr().err, f"`{flag}`", message)
    assert not tmp_path.with_name(tmp_path.name + ".tmp").exists()


def test_report_checks_export_before_reading(not_a_folder: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from scheduler.integrations.ledger import SqliteLedger

    SqliteLedger(tmp_path / "ledger.sqlite").close()
    argv = ["report", "--ledger", str(tmp_path / "ledger.sqlite"), "--export", str(not_a_folder / "runs.jsonl")]
    assert_input_error(main(argv), capsys.readouterr().err, "`--export` cannot create the folder")


@pytest.mark.parametrize(("content", "message"), [
    (b"", "is not a vramfit ledger"),
    (b"decisions: []\n", "file is not a database"),
])
def test_report_never_turns_a_file_into_a_ledger(content: bytes, message: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "e.yaml"
    path.write_bytes(content)
    assert_input_error(main(["report", "--ledger", str(path)]), capsys.readouterr().err, str(path), message)
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.yaml"]  # no -wal, no -shm


def test_report_reads_a_ledger_without_writing_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from scheduler.integrations.ledger import SqliteLedger

    path = tmp_path / "ledger.sqlite"
    SqliteLedger(path).close()
    before = path.read_bytes()
    assert main(["report", "--ledger", str(path)]) == 0
    assert "decisions 0" in capsys.readouterr().out
    assert path.read_bytes() == before
    assert main(["report", "--ledger", str(tmp_path / "missing.sqlite")]) == 2
    assert "no ledger at" in capsys.readouterr().err and not (tmp_path / "missing.sqlite").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["collect", "--prometheus-url", "http://p", "--interval-seconds", "0"],
     "--interval-seconds must be a number of seconds, at least 1; got 0"),
    (["collect", "--prometheus-url", "http://p", "--interval-seconds", "-5"], "at least 1; got -5"),
    (["collect", "--prometheus-url", "http://p", "--interval-seconds", "nan"], "at least 1; got nan"),
    (["collect", "--serve-port", "0", "--tls-reload-seconds", "0"],
     "--tls-reload-seconds must be a number of seconds, at least 0.1; got 0"),
    (["serve", "--tls-reload-seconds", "-1"], "--tls-reload-seconds must be a number of seconds, at least 0.1"),
])
def test_periods_that_would_busy_loop_are_refused(argv: list[str], message: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert_input_error(main(argv), capsys.readouterr().err, message)


def test_evaluate_refuses_an_empty_selection(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert_input_error(main(["evaluate", "--runs", str(empty)]), capsys.readouterr().err,
                       f"`--runs` no reference runs in {empty}")
    assert_input_error(main(["evaluate", "--runs", str(empty), "--quality", ""]), capsys.readouterr().err,
                       "`--quality` selects no quality; got ''")


def test_evaluate_refuses_a_quality_no_run_has(dev_runs_path: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    high = tmp_path / "high.jsonl"
    lines = dev_runs_path.read_text(encoding="utf-8").splitlines()
    high.write_text("\n".join(line for line in lines if line.strip() and json.loads(line)["quality"] == "high"))
    assert_input_error(main(["evaluate", "--runs", str(high), "--quality", "low"]), capsys.readouterr().err,
                       "`--quality` none of the", "has quality low (they have high)")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--version"])
    assert caught.value.code == 0
    assert capsys.readouterr().out.strip() == f"vramfit {package_version()}"


def test_gpus_table_columns_line_up(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header, rows = lines[0], lines[1:]
    assert any(row.startswith("A100-80GB-PCIe ") for row in rows)
    # every column ends where its header does: the memory column's "G" under the "y" of "memory"
    memory_end = header.index("memory") + len("memory")
    assert all(row[memory_end - 1] == "G" for row in rows), "\n".join(lines)
    assert {len(row) for row in rows} == {len(header)}


def test_serve_creates_no_ledger_when_another_input_is_bad(tmp_path: Path) -> None:
    ledger = tmp_path / "new-ledger.sqlite"
    proc = run_cli("serve", "--port", "0", "--ledger", str(ledger), "--token-file", str(tmp_path / "nonexistent"))
    assert_input_error(proc.returncode, proc.stderr, "`--token-file` cannot read the token file")
    assert not ledger.exists()


@pytest.mark.parametrize("gpus", ["2000000", "1" + "0" * 400], ids=["2e6", "1e400"])
def test_predict_refuses_a_gpu_count_beyond_the_spec_limit(gpus: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`predict --gpus 10**400` (a 401-digit flag) was an OverflowError traceback from the runtime model; the flag
    has the bound of spec.gpus (a million)."""
    spec = tmp_path / "spec.yaml"
    spec.write_text("model: llama-3.2-1b\ngpu: A100-80GB\nsharding: fsdp\n")
    assert_input_error(main(["predict", str(spec), "--gpus", gpus]), capsys.readouterr().err,
                       "`--gpus` must be at most 1,000,000")


def test_numbers_past_floats_range_are_named_input_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An integer of hundreds of digits (under Python's 4,300-digit parse limit) in a manifest count, a reference
    run's peak or a job's arrival overflowed float(): OverflowError tracebacks (exit 1) in predict, place, parse,
    evaluate, train and simulate. A volumeMount whose name is a list was a TypeError."""
    import yaml

    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "annotations": {
        "vramfit.io/spec": "model: gpt2"}}, "spec": {"parallelism": 10**320, "template": {"spec": {"containers": [
            {"name": "m", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}}
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(job))
    for command in ("predict", "place", "parse"):
        assert main([command, str(manifest)]) == 2
        assert "spec.parallelism` is too large to be a number" in capsys.readouterr().err
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "annotations": {"vramfit.io/spec": "model: gpt2"}},
           "spec": {"containers": [{"name": "m", "image": "x", "volumeMounts": [{"name": ["a"], "mountPath": "/c"}],
                                    "resources": {"limits": {"nvidia.com/gpu": 1}}}],
                    "volumes": [{"name": "a", "configMap": {"name": "c"}}]}}
    mounted = tmp_path / "pod.yaml"
    mounted.write_text(yaml.safe_dump(pod))
    assert main(["parse", str(mounted)]) == 0
    capsys.readouterr()
    runs = tmp_path / "runs.jsonl"
    runs.write_text(json.dumps({"id": "BIG", "spec": {"model": "gpt2"}, "gpu": "A100-80GB", "quality": "high",
                                "measured": {"peak_bytes": 10**400, "metric": "allocated"}}) + "\n")
    assert main(["train", "--runs", str(runs), "--out", str(tmp_path / "m.skops"), "--no-cv"]) == 2
    assert "measured.peak_bytes" in capsys.readouterr().err
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"spec": {"model": "gpt2", "train_tokens": 1e6}, "arrival_seconds": ' + "9" * 400 + "}\n")
    assert main(["simulate", "--jobs", str(jobs), "--no-plots", "--no-progress"]) == 2
    assert "arrival_seconds" in capsys.readouterr().err


def test_json_output_stays_json_whatever_a_figure_comes_to(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A pool price of 1e308 USD took place's cost to Infinity, and --format json printed a bare `Infinity`, which
    JSON parsers refuse (report alone made such figures null). Every command's JSON output is strict now."""
    pools = tmp_path / "pools.yaml"
    pools.write_text("pools:\n  - {name: a, gpu: A100-80GB, gpus_per_node: 8, nodes: 2, "
                     "price_usd_per_gpu_hour: 1e308}\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text("model: llama-3.2-1b\nmethod: lora\ntrain_tokens: 1e8\n")
    assert main(["place", str(spec), "--pools", str(pools), "--format", "json"]) == 0
    text = capsys.readouterr().out
    assert "Infinity" not in text and "NaN" not in text
    json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))


def test_a_host_a_deadline_and_a_trace_field_out_of_range_are_named(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """serve --host of no address exited 3 with uvicorn's "Name or service not known"; --deadline-hours 1e308
    overflowed and blamed --objective; a trace field past the csv module's 131,072 characters was a _csv.Error
    traceback. Each is an input error naming what is wrong."""
    result = run_cli("serve", "--host", "no-such-host.invalid", "--port", "0")
    assert result.returncode == 2 and "--host 'no-such-host.invalid' is not an address" in result.stderr
    spec = tmp_path / "spec.yaml"
    spec.write_text("model: llama-3.2-1b\nmethod: lora\ntrain_tokens: 1e8\n")
    assert main(["place", str(spec), "--deadline-hours", "1e308"]) == 2
    assert "`--deadline-hours` must be at most" in capsys.readouterr().err
    traces = tmp_path / "philly_pollux_subset"
    traces.mkdir()
    (traces / "philly.csv").write_text("timestamp,duration,num_gpus,gpu_time,cluster\n"
                                       f"2017-10-09 07:01:55,66.0,1,66.0,{'x' * 200_000}\n")
    assert main(["simulate", "--jobs", "philly:10", "--traces-dir", str(tmp_path), "--no-plots", "--no-progress"]) == 2
    assert "`line 2` is not a CSV row" in capsys.readouterr().err


@pytest.mark.parametrize("label", ["bad label!", "", "-starts-with-dash", "Upper.Case.Prefix/pool", "x" * 64])
def test_a_kueue_flavor_label_that_is_no_label_key_is_refused(label: str) -> None:
    """--kueue-flavor-label 'bad label!' became a nodeSelector key the API server refuses, so every Kueue job failed
    to be created; an empty one was silently ignored."""
    result = run_cli("serve", f"--kueue-flavor-label={label}", "--port", "0")
    assert result.returncode == 2 and "must be a Kubernetes label key" in result.stderr, result.stderr
