"""Experiment tracking (``report_to``) with the real libraries, all offline: each tracker's own files are
read back after the run (TensorBoard events, the W&B offline run, trackio's database, MLflow's store)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from grpokit.config import GRPOConfig
from grpokit.reporting import tracking
from grpokit.reporting.metrics_log import MetricsLogger
from grpokit.reporting.tracking import RunInfo, installed_sinks, resolve_sinks

STEPS = {
    1: {"reward": 0.25, "kl": 0.0, "time/step": 1.5, "rewards/<lambda>/mean": 0.125},
    2: {"reward": 0.5, "kl": 0.01, "time/step": 1.25, "rewards/<lambda>/mean": 0.375},
    3: {"reward": 0.75, "kl": 0.02, "time/step": 1.0, "rewards/<lambda>/mean": 0.625},
}


def offline_env(root: Path) -> dict[str, str]:
    """Every tracker local and silent; a W&B server address nothing listens on, so any network use fails."""
    return {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_DIR": str(root / "wandb-default"),
        "WANDB_BASE_URL": "http://127.0.0.1:9",
        "MLFLOW_TRACKING_URI": (root / "mlruns").as_uri(),
        "MLFLOW_ALLOW_FILE_STORE": "true",  # MLflow 3 refuses a file store unless asked
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "1",
        "TRACKIO_DIR": str(root / "trackio"),
        "HF_HUB_OFFLINE": "1",
    }


@pytest.fixture(autouse=True)
def _offline(tmp_path, monkeypatch):
    for key, value in offline_env(tmp_path).items():
        monkeypatch.setenv(key, value)


def log_all(logger: MetricsLogger) -> None:
    for step, metrics in STEPS.items():
        logger.log(step, metrics)


# ---- TensorBoard -----------------------------------------------------------------------------------------
def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def tensorboard_text(log_dir: Path, tag: str) -> str:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    (event,) = events.Tensors(f"{tag}/text_summary")
    (text,) = event.tensor_proto.string_val
    return text.decode()


def test_tensorboard_events_hold_every_scalar(tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path / "run"), report_to="tensorboard")
    logger = MetricsLogger.from_config(args, enabled=True)
    log_all(logger)
    logger.close()
    scalars = tensorboard_scalars(tmp_path / "run" / "tensorboard")
    assert set(scalars) == set(STEPS[1])
    for tag, points in scalars.items():
        assert [step for step, _ in points] == list(STEPS)
        assert [value for _, value in points] == pytest.approx([STEPS[s][tag] for s in STEPS], abs=1e-6)
    assert [r["step"] for r in logger.read()] == list(STEPS)  # metrics.jsonl unchanged
    config = tensorboard_text(tmp_path / "run" / "tensorboard", "config")
    assert json.loads(config) == json.loads(json.dumps(args.to_dict()))


def test_tensorboard_flushes_at_every_log_and_honours_logging_dir(tmp_path):
    args = GRPOConfig(
        output_dir=str(tmp_path / "run"), report_to="tensorboard", logging_dir=str(tmp_path / "tb")
    )
    logger = MetricsLogger.from_config(args, enabled=True)
    logger.log(7, {"reward": 0.5})
    assert tensorboard_scalars(tmp_path / "tb") == {"reward": [(7, 0.5)]}  # on disk before close
    logger.close()
    logger.close()  # idempotent
    assert not (tmp_path / "run" / "tensorboard").exists()


# ---- Weights & Biases ------------------------------------------------------------------------------------
def wandb_records(run_dir: Path) -> list[Any]:
    """The records of an offline run's ``run-<id>.wandb`` file: W&B's header, then LevelDB-log framed
    protobuf ``Record`` messages (32 KiB blocks; 7-byte chunk headers: crc32, length, type). The service
    may be writing the file while it is read: a chunk whose payload is not all there yet ends the list."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pending, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        payload, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if len(payload) < length:  # the writer is still at it
            break
        if kind == 0:
            continue
        pending = payload if kind in (1, 2) else pending + payload
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


def wandb_run(output_dir: Path) -> dict[str, Any]:
    """What the offline run recorded: its project, name and config, the logged history and its exit.
    W&B's service process writes the file behind ``finish()``: wait (60 s at most) for the exit record."""
    (run_dir,) = (output_dir / "wandb").glob("offline-run-*")
    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + 60
    while True:
        try:  # a half-written file may also end in a record whose bytes are not all flushed
            records = wandb_records(run_dir)
        except DecodeError:
            if time.monotonic() > deadline:
                raise
            records = []
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    found: dict[str, Any] = {"history": {}, "exit_codes": []}
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "run":
            found["project"], found["name"] = record.run.project, record.run.display_name
            found["config"] = {u.key: json.loads(u.value_json) for u in record.run.config.update}
        elif kind == "history":
            items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
            found["history"][items.pop("_step")] = {k: v for k, v in items.items() if not k.startswith("_")}
        elif kind == "exit":
            found["exit_codes"].append(record.exit.exit_code)
    return found


def test_wandb_offline_run_is_named_configured_logged_and_finished(tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path / "my-run"), report_to=["wandb"], project="tracking-test")
    logger = MetricsLogger.from_config(args, enabled=True)
    log_all(logger)
    logger.close()
    logger.close()
    run = wandb_run(tmp_path / "my-run")
    assert (run["project"], run["name"]) == ("tracking-test", "my-run")  # name: output_dir's last part
    assert run["config"]["learning_rate"] == args.learning_rate
    assert run["config"]["report_to"] == ["wandb"]
    assert run["config"]["output_dir"] == str(tmp_path / "my-run")
    assert run["history"] == {step: pytest.approx(metrics) for step, metrics in STEPS.items()}
    assert run["exit_codes"] == [0]  # finished


def test_wandb_run_name_and_a_failed_run(tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path / "out"), report_to="wandb", run_name="named")
    with pytest.raises(RuntimeError, match="boom"), MetricsLogger.from_config(args, enabled=True) as logger:
        logger.log(1, {"reward": 1.0})
        raise RuntimeError("boom")
    run = wandb_run(tmp_path / "out")
    assert run["name"] == "named"
    assert run["history"] == {1: {"reward": 1.0}}
    assert run["exit_codes"] == [1]


# ---- MLflow ----------------------------------------------------------------------------------------------
def mlflow_run(tmp_path: Path, experiment: str) -> tuple[Any, dict[str, list[tuple[int, float]]]]:
    import mlflow

    client = mlflow.MlflowClient((tmp_path / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    history = {
        key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
        for key in run.data.metrics
    }
    return run, history


def test_mlflow_run_is_named_configured_logged_and_finished(tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path / "ml-run"), report_to="mlflow", project="tracking-test")
    logger = MetricsLogger.from_config(args, enabled=True)
    log_all(logger)
    logger.close()
    logger.close()
    run, history = mlflow_run(tmp_path, "tracking-test")
    assert run.info.run_name == "ml-run"
    assert run.info.status == "FINISHED"
    assert run.data.params["learning_rate"] == str(args.learning_rate)
    assert run.data.params["report_to"] == "['mlflow']"
    assert len(run.data.params) == len(args.to_dict())  # more than one batch of 100
    renamed = {"rewards/<lambda>/mean": "rewards/_lambda_/mean"}  # MLflow refuses < and >
    assert set(history) == {renamed.get(k, k) for k in STEPS[1]}
    for key in STEPS[1]:
        assert history[renamed.get(key, key)] == [(step, pytest.approx(STEPS[step][key])) for step in STEPS]


def test_mlflow_run_of_a_failed_block_is_marked_failed(tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path / "out"), report_to="mlflow", run_name="broken")
    with pytest.raises(KeyError), MetricsLogger.from_config(args, enabled=True) as logger:
        logger.log(1, {"reward": 1.0})
        raise KeyError("x")
    run, history = mlflow_run(tmp_path, "grpokit")
    assert (run.info.run_name, run.info.status) == ("broken", "FAILED")
    assert history == {"reward": [(1, 1.0)]}


def test_mlflow_store_that_cannot_be_opened_says_what_to_set(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "no-such-scheme://store")
    args = GRPOConfig(output_dir=str(tmp_path / "run"), report_to=["tensorboard", "mlflow"])
    with pytest.raises(RuntimeError, match="MLFLOW_TRACKING_URI") as caught:
        MetricsLogger.from_config(args, enabled=True)
    assert "no-such-scheme://store" in str(caught.value)


# ---- trackio and "all" (in a child process: trackio reads TRACKIO_DIR when it is imported) -----------------
CHILD = """
import json, sys
from grpokit.config import GRPOConfig
from grpokit.reporting.metrics_log import MetricsLogger
report_to, output_dir, steps = json.loads(sys.argv[1])
args = GRPOConfig(output_dir=output_dir, report_to=report_to, project="tracking-test")
logger = MetricsLogger.from_config(args, enabled=True)
names = [sink.name for sink in logger.sinks]
for step, metrics in steps.items():
    logger.log(int(step), metrics)
logger.close()
logger.close()
import trackio
from trackio.sqlite_storage import SQLiteStorage
runs = [{"name": r.name, "config": r.config} for r in trackio.Api().runs("tracking-test")]
rows = SQLiteStorage.get_logs("tracking-test", runs[0]["name"])
logs = [{k: v for k, v in row.items() if k != "timestamp"} for row in rows]
print("RESULT " + json.dumps({"sinks": names, "runs": runs, "logs": logs}))
"""


def run_child(tmp_path: Path, report_to: str | list[str], output_dir: Path) -> dict[str, Any]:
    env = {**os.environ, **offline_env(tmp_path)}
    argument = json.dumps([report_to, str(output_dir), STEPS])
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), argument],
        env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))


def check_trackio(found: dict[str, Any], name: str, args: GRPOConfig) -> None:
    (run,) = found["runs"]
    assert run["name"] == name
    assert run["config"]["learning_rate"] == args.learning_rate
    assert {row["step"]: {k: v for k, v in row.items() if k != "step"} for row in found["logs"]} == {
        step: pytest.approx(metrics) for step, metrics in STEPS.items()
    }


@pytest.mark.skipif("trackio" not in installed_sinks(), reason="needs grpokit[trackio]")
def test_trackio_run_is_named_configured_and_logged(tmp_path):
    found = run_child(tmp_path, "trackio", tmp_path / "tk-run")
    assert found["sinks"] == ["trackio"]
    check_trackio(found, "tk-run", GRPOConfig(output_dir=str(tmp_path / "tk-run")))
    assert (tmp_path / "trackio").is_dir()  # TRACKIO_DIR, not the user's cache


@pytest.mark.skipif(installed_sinks() != list(tracking.SINKS), reason="needs every tracker installed")
def test_all_opens_every_installed_tracker_and_each_records_the_run(tmp_path):
    output_dir = tmp_path / "all-run"
    found = run_child(tmp_path, "all", output_dir)
    assert found["sinks"] == list(tracking.SINKS)
    check_trackio(found, "all-run", GRPOConfig(output_dir=str(output_dir)))
    assert set(tensorboard_scalars(output_dir / "tensorboard")) == set(STEPS[1])
    assert wandb_run(output_dir)["exit_codes"] == [0]
    run, history = mlflow_run(tmp_path, "tracking-test")
    assert run.info.status == "FINISHED" and len(history) == len(STEPS[1])


# ---- report_to forms, missing packages, other processes --------------------------------------------------
@pytest.mark.parametrize(
    ("report_to", "sinks"),
    [
        ("none", []),
        ([], []),
        (None, []),
        ("tensorboard", ["tensorboard"]),
        (" mlflow ", ["mlflow"]),
        (["tensorboard", "mlflow"], ["tensorboard", "mlflow"]),
        (["mlflow", "none", "mlflow"], ["mlflow"]),
    ],
)
def test_report_to_forms_through_grpoconfig(tmp_path, report_to, sinks):
    args = GRPOConfig(output_dir=str(tmp_path / "run"), report_to=report_to)
    with MetricsLogger.from_config(args, enabled=True) as logger:
        assert [sink.name for sink in logger.sinks] == sinks
        logger.log(1, {"reward": 1.0})
    assert logger.sinks == []
    assert logger.read() == [{"step": 1, "reward": 1.0}]


def test_all_means_every_installed_tracker_and_none_installed_is_a_no_op(tmp_path, monkeypatch):
    assert resolve_sinks("all") == installed_sinks()
    assert resolve_sinks(["tensorboard", "all"]) == list(dict.fromkeys(["tensorboard", *installed_sinks()]))
    monkeypatch.setattr(tracking, "_importable", lambda module: False)
    args = GRPOConfig(output_dir=str(tmp_path / "run"), report_to="all")
    with MetricsLogger.from_config(args, enabled=True) as logger:
        assert logger.sinks == []
        logger.log(1, {"reward": 1.0})
    assert logger.read() == [{"step": 1, "reward": 1.0}]


def test_a_missing_package_names_its_extra_and_opens_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(tracking, "_importable", lambda module: module != "wandb")
    args = GRPOConfig(output_dir=str(tmp_path / "run"), report_to=["tensorboard", "wandb"])
    with pytest.raises(ImportError, match=r"pip install 'grpokit\[wandb\]'"):
        MetricsLogger.from_config(args, enabled=True)
    assert not (tmp_path / "run" / "tensorboard").exists()


def test_unknown_sink_is_refused(tmp_path):
    with pytest.raises(ValueError, match="report_to"):
        GRPOConfig(output_dir=str(tmp_path), report_to="neptune")
    with pytest.raises(ValueError, match="unknown sink 'neptune'"):
        MetricsLogger(tmp_path, ["neptune"])


def test_a_process_other_than_the_main_one_writes_and_opens_nothing(tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path / "run"), report_to=["tensorboard", "wandb", "mlflow"])
    with MetricsLogger.from_config(args, enabled=False) as logger:
        logger.log(1, {"reward": 1.0})
        assert logger.sinks == []
    assert not (tmp_path / "run").exists()
    assert logger.read() == []


def test_close_closes_every_sink_even_when_one_fails(tmp_path):
    closed: list[str] = []

    class Sink:
        def __init__(self, name: str, fails: bool) -> None:
            self.name, self.fails = name, fails

        def log(self, step: int, metrics: dict[str, float]) -> None:
            pass

        def close(self, failed: bool = False) -> None:
            closed.append(self.name)
            if self.fails:
                raise OSError(f"{self.name} could not close")

    logger = MetricsLogger(tmp_path)
    logger.sinks = [Sink("a", True), Sink("b", False)]
    with pytest.raises(OSError, match="a could not close"):
        logger.close()
    assert closed == ["a", "b"]
    logger.close()
    assert closed == ["a", "b"]


def test_tokens_never_reach_a_tracker(tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path / "run"), hub_token="hf_secret")
    config = RunInfo.from_config(args).config
    assert config["hub_token"] == "<redacted>" and "hf_secret" not in json.dumps(config)
    assert config["learning_rate"] == args.learning_rate
    assert RunInfo.from_config(GRPOConfig(output_dir=str(tmp_path))).config["hub_token"] is None


def test_run_info_defaults(tmp_path):
    run = RunInfo(output_dir=tmp_path / "x" / "last")
    assert (run.name, run.tensorboard_dir) == ("last", tmp_path / "x" / "last" / "tensorboard")
    assert RunInfo(output_dir=Path("."), run_name="r").name == "r"
    assert RunInfo(output_dir=Path(".")).name == Path.cwd().name


def test_a_training_run_reports_to_tensorboard_and_wandb_and_finishes_both(tiny_model_dir, tmp_path):
    """Through GRPOTrainer: every logged step reaches both trackers with the values of metrics.jsonl, the
    W&B run is named after run_name and finished when train() returns."""
    from grpokit import GRPOTrainer
    from grpokit.data.records import read_jsonl

    from ..conftest import small_config

    def reward(prompts, completions, completion_ids, **kwargs):
        return [float(len(ids) % 3) for ids in completion_ids]

    args = small_config(
        tmp_path, max_steps=2, beta=0.0, report_to=["tensorboard", "wandb"], run_name="grpo-tiny"
    )
    rows = [{"prompt": "1+1="}, {"prompt": "2+3="}]
    GRPOTrainer(str(tiny_model_dir), [reward], args, train_dataset=rows).train()
    logged = read_jsonl(tmp_path / "run" / "metrics.jsonl", "metrics")
    scalars = tensorboard_scalars(tmp_path / "run" / "tensorboard")
    assert scalars["reward"] == [(r["step"], pytest.approx(r["reward"])) for r in logged]
    run = wandb_run(tmp_path / "run")
    assert run["name"] == "grpo-tiny" and run["exit_codes"] == [0]
    assert sorted(run["history"]) == [1, 2]
    assert run["history"][2]["reward"] == pytest.approx(logged[1]["reward"])
