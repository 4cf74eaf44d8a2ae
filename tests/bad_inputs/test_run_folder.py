"""A run owns its folder (``grpokit.data.run_folder``): the ways a second run, a concurrent run, a reward
model's training or a save used to destroy another run's results, each run again and shown to lose nothing;
and the inputs that used to be silently ignored or mis-read, each honoured or refused."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.cli import main
from grpokit.cli.recipes import parse_train_args
from grpokit.cli.train_command import check_run
from grpokit.cli.train_rm_command import train_rm_main
from grpokit.data.run_folder import LOCK_FILE, MANIFEST, folder_state
from grpokit.parallel.checkpoint import latest_checkpoint, written_aside

from ..conftest import small_config

ROWS = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(3) for b in range(3)]


def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def cli(model, out, *extra: str) -> list[str]:
    return ["train", f"model={model}", "task=arithmetic", f"output_dir={out}", "num_train_examples=16",
            "num_eval_examples=4", "eval_max_new_tokens=4", "num_generations=4",
            "per_device_train_batch_size=8", "max_completion_length=4", "disable_tqdm=true", "max_steps=1",
            *extra]  # fmt: skip


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def manifest(folder: Path) -> dict:
    return json.loads((folder / MANIFEST).read_text())


# -- data loss, each case run again ------------------------------------------------------------------------
def test_a_second_run_into_a_finished_runs_folder_is_refused_and_changes_nothing(tiny_model_dir, tmp_path):
    """Before: a finished run without checkpoints (save_steps=0) was replaced: model, config.yaml and
    eval_summary.json rewritten, metrics.jsonl appended (steps 1, 2, 1)."""
    out = tmp_path / "run"
    assert main(cli(tiny_model_dir, out)) == 0
    assert manifest(out)["state"] == "finished" and manifest(out)["kind"] == "train"
    before = snapshot(out)
    message = (
        rf"^grpokit: output_dir {out} holds the results of a finished train run .*: eval_summary.json, "
        r"metrics.jsonl, metrics.png, a saved model. Choose another output_dir, or "
        r"overwrite_output_dir=true to delete them first$"
    )
    with pytest.raises(SystemExit, match=message):
        main(cli(tiny_model_dir, out, "max_steps=2"))
    assert snapshot(out) == before
    with pytest.raises(
        ValueError, match="holds the results of a finished train run"
    ):  # Python, at construction
        GRPOTrainer(str(tiny_model_dir), [length_reward], small_config(tmp_path), train_dataset=ROWS)
    assert snapshot(out) == before


def test_overwrite_deletes_the_old_runs_checkpoints_before_the_new_run_writes(tiny_model_dir, tmp_path):
    """Before: overwrite_output_dir left the old checkpoints: `latest` resumed the old run's checkpoint-3,
    and save_total_limit=1 deleted the new run's checkpoint and kept the old one."""
    out = tmp_path / "run"
    assert main(cli(tiny_model_dir, out, "max_steps=3", "save_steps=1")) == 0
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [
        "checkpoint-1",
        "checkpoint-2",
        "checkpoint-3",
    ]
    old_id = manifest(out)["run_id"]
    args = cli(tiny_model_dir, out, "max_steps=2", "save_steps=1", "save_total_limit=1",
               "overwrite_output_dir=true", "seed=7")  # fmt: skip
    assert main(args) == 0
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-2"]  # the new run's, kept by the limit
    assert latest_checkpoint(out).name == "checkpoint-2"
    assert "seed: 7" in (out / "checkpoint-2" / "config.yaml").read_text()  # the new run's checkpoint
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]  # the old run's records are gone, not appended to
    assert manifest(out)["run_id"] != old_id


def test_overwrite_never_deletes_what_the_run_reads(tiny_model_dir, tmp_path):
    import shutil

    model = shutil.copytree(tiny_model_dir, tmp_path / "model")
    with pytest.raises(
        SystemExit, match=r"holds .*model, which this run reads: overwrite_output_dir=true would"
    ):
        main(cli(model, model, "overwrite_output_dir=true"))
    assert (model / "model.safetensors").exists()


HOLDER = textwrap.dedent("""
    import sys, time
    from grpokit.data.run_folder import claim_run_folder
    with claim_run_folder(sys.argv[1], "train"):
        print("holding", flush=True)
        time.sleep(600)
""")


def test_a_second_process_into_a_folder_in_use_is_refused_at_once_and_a_dead_ones_lock_is_free(
    tiny_model_dir, tmp_path
):
    """Before: two runs into one folder both exited 0, their metrics interleaved and the first one's model was
    overwritten. After the holder is killed (kill -9) its lock is gone with it."""
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        started = time.monotonic()
        with pytest.raises(
            SystemExit, match=rf"output_dir {out} is in use: a train run \(process {holder.pid} "
        ):
            main(cli(tiny_model_dir, out))
        assert time.monotonic() - started < 60  # at once: no cold start, no load
        with pytest.raises(ValueError, match=rf"is in use: a train run \(process {holder.pid} "):
            GRPOTrainer(str(tiny_model_dir), [length_reward], small_config(tmp_path), train_dataset=ROWS)
    finally:
        holder.kill()
        holder.wait(timeout=60)
    assert folder_state(out).holder is None and manifest(out)["state"] == "running"  # it never closed it
    assert main(cli(tiny_model_dir, out)) == 0  # no results there: taken
    assert manifest(out)["state"] == "finished"


def test_train_rm_into_a_trained_policys_folder_is_refused_before_any_work(tiny_model_dir, tmp_path, capsys):
    """Before: the policy's weights and config were replaced by a sequence classifier's, under its card."""
    out = tmp_path / "policy"
    assert main(cli(tiny_model_dir, out)) == 0
    before = snapshot(out)
    data = tmp_path / "labels.jsonl"
    data.write_text("".join(json.dumps({"prompt": "1+1=", "completion": c, "label": float(c == "2")}) + "\n"
                            for c in ("2", "3")))  # fmt: skip
    argv = ["--kind", "outcome", "--model", "tiny", "--dataset", str(data), "--output_dir", str(out)]
    assert train_rm_main(argv) == 2
    assert "holds the results of a finished train run" in capsys.readouterr().err
    assert snapshot(out) == before
    assert train_rm_main([*argv[:-1], str(tmp_path / "rm")]) == 0  # its own folder: trained, recorded
    assert (
        manifest(tmp_path / "rm")["kind"] == "train-rm" and manifest(tmp_path / "rm")["state"] == "finished"
    )


class _SignalAtTheLastStep:
    """A callback that sends SIGTERM to this process when the last step ends, before the final save."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == state.max_steps:
            os.kill(os.getpid(), signal.SIGTERM)
        return control


def test_sigterm_between_the_last_step_and_the_final_save_still_saves_the_model(
    tiny_model_dir, tmp_path, capsys
):
    """Before: exit 143, no message, no model, no checkpoint (signals were handled only inside the loop)."""
    config = small_config(tmp_path, max_steps=2)
    trainer = GRPOTrainer(str(tiny_model_dir), [length_reward], config, train_dataset=ROWS,
                          callbacks=[_SignalAtTheLastStep()])  # fmt: skip
    trainer.train()
    out = Path(config.output_dir)
    assert trainer.finished and trainer.stopped_by is None
    saved, weights = load_file(str(out / "model.safetensors")), trainer.model.state_dict()
    assert saved and all(torch.equal(value, weights[name]) for name, value in saved.items())
    assert manifest(out)["state"] == "finished" and manifest(out)["model_saved"] is True
    assert "SIGTERM came during the last step or the final save, which completed" in capsys.readouterr().out


def test_sigterm_just_after_training_finished_says_so_and_records_a_finished_run(
    tiny_model_dir, tmp_path, capsys, monkeypatch
):
    """Before: a signal in the moment after ``train()`` ended (model saved, manifest saying training
    finished) closed with "checkpoint-1 (no final model yet); continue with ... resume_from_checkpoint" and
    left the run ``interrupted`` (seen once in 20 random signals of tests/train/test_interrupt_anywhere)."""
    train = GRPOTrainer.train

    def train_then_signal(self, *args, **kwargs):
        history = train(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # the real handler: raised at once, outside the deferred block
        return history

    monkeypatch.setattr(GRPOTrainer, "train", train_then_signal)
    out = tmp_path / "run"
    assert main(cli(tiny_model_dir, out, "save_steps=1")) == 0
    closing = capsys.readouterr().out.strip().splitlines()[-1]
    assert "stopped by SIGTERM during training; the run finished first" in closing, closing
    assert "evaluation after training was skipped" in closing and "resume_from_checkpoint" not in closing
    assert manifest(out)["state"] == "finished" and manifest(out)["training"] == "finished"
    assert (out / "model.safetensors").exists() and (out / "eval_summary.json").exists()


def test_a_save_cut_off_leaves_the_folder_as_it_was(tmp_path):
    """The final model is written aside and renamed in: a save that dies midway (here: raises) leaves the
    old files whole and no half file among them."""
    (tmp_path / "model.safetensors").write_bytes(b"old weights")
    with pytest.raises(RuntimeError), written_aside(tmp_path) as aside:
        (aside / "model.safetensors").write_bytes(b"new wei")
        raise RuntimeError("killed mid-save")
    assert (tmp_path / "model.safetensors").read_bytes() == b"old weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]
    with written_aside(tmp_path) as aside:
        (aside / "model.safetensors").write_bytes(b"new weights")
    assert (tmp_path / "model.safetensors").read_bytes() == b"new weights"


def test_a_checkpoint_whose_rename_was_cut_off_is_never_latest(tmp_path):
    """checkpoint-3.tmp holding every file (killed between the last write and the rename) is not a checkpoint
    (before: its name broke the step's parsing)."""
    for name in ("checkpoint-2", "checkpoint-3.tmp"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "trainer_state.json").write_text("{}")
    assert latest_checkpoint(tmp_path).name == "checkpoint-2"


def test_save_model_defaults_to_output_dir_and_refuses_another_runs_folder(tiny_model_dir, tmp_path):
    other = tmp_path / "other"
    GRPOTrainer(str(tiny_model_dir), [length_reward], small_config(other), train_dataset=ROWS).train()
    trainer = GRPOTrainer(
        str(tiny_model_dir), [length_reward], small_config(tmp_path / "mine"), train_dataset=ROWS
    )
    trainer.train()
    (tmp_path / "mine" / "run" / "model.safetensors").unlink()
    trainer.save_model()  # TRL's: no path is output_dir
    assert (tmp_path / "mine" / "run" / "model.safetensors").exists()
    with pytest.raises(
        ValueError, match=r"save_model: .*other/run holds the results of a finished train run"
    ):
        trainer.save_model(other / "run")
    trainer.save_model(tmp_path / "export")  # a plain folder: written
    assert (tmp_path / "export" / "config.json").exists()


def test_train_again_continues_only_where_there_is_something_to_train(tiny_model_dir, tmp_path):
    """Before: a second train() did nothing and said nothing."""
    trainer = GRPOTrainer(str(tiny_model_dir), [length_reward], small_config(tmp_path), train_dataset=ROWS)
    trainer.train()
    with pytest.raises(ValueError, match=r"train\(\) already ran to step 1 of max_steps=1 on this trainer"):
        trainer.train()


# -- inputs that were silently ignored or mis-read ----------------------------------------------------------
def test_a_tilde_in_output_dir_is_the_home_folder(tiny_model_dir, tmp_path, monkeypatch):
    """Before: ``output_dir=~/x`` wrote to a literal ``./~/x`` (while ``dataset=~/...`` was expanded)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert GRPOConfig(output_dir="~/runs/a").output_dir == str(tmp_path / "home" / "runs" / "a")
    assert main(cli(tiny_model_dir, "~/runs/b", "evaluate=false")) == 0
    assert (tmp_path / "home" / "runs" / "b" / "model.safetensors").exists()
    assert not (tmp_path / "~").exists()


def test_num_examples_are_honoured_with_data_files(tmp_path):
    """Before: num_train_examples / num_eval_examples were ignored when dataset / eval_dataset were given."""
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    args = parse_train_args(["task=null", f"dataset={data}", f"eval_dataset={data}",
                             "reward_funcs=[accuracy]", "num_train_examples=4", "num_eval_examples=3",
                             "per_device_train_batch_size=16", "num_generations=4", "evaluate=true",
                             f"output_dir={tmp_path / 'run'}",
                             "model=tiny:arithmetic"])  # fmt: skip
    checked = check_run(args)
    assert checked.train_rows == ROWS[:4] and checked.held_out.rows == ROWS[:3]


def test_a_data_set_smaller_than_a_step_is_refused(tiny_model_dir, tmp_path):
    """Before: one row under a 16-prompt step trained the same prompt 16 times without a word."""
    config = small_config(tmp_path, per_device_train_batch_size=64, num_generations=4)
    with pytest.raises(
        ValueError, match=r"train_dataset has 9 row\(s\) but each step takes 16 distinct prompts"
    ):
        GRPOTrainer(str(tiny_model_dir), [length_reward], config, train_dataset=ROWS)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["top_p=0"], r"top_p must be in \(0, 1\], got 0.0"),
        (["top_k=-3"], r"top_k must be >= 0, got -3"),
        (["correct_threshold=nan"], r"correct_threshold must be a finite number, got nan"),
        (["num_eval_examples=-1"], r"num_eval_examples must be >= 1, got -1"),
        (["device=cuda"], r"device=cuda: this machine has no CUDA device"),
        (["output={dir}"], r"output: {dir} is a folder; give a file path"),
        (["output={existing}"], r"output: {existing} already exists .*overwrite_output=true"),
    ],
)
def test_grpokit_eval_refuses_what_grpoconfig_refuses_before_the_model_loads(
    tmp_path, monkeypatch, extra, message
):
    """Before: top_p=0 and top_k=-3 were accepted, correct_threshold=nan gave accuracy 0 and NaN in the JSON,
    num_eval_examples=-1 dropped the last row, device=cuda asserted, output=<folder> failed after the whole
    evaluation."""
    if extra == ["device=cuda"] and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("GRPOKIT_CACHE", str(cache))
    existing = tmp_path / "eval.json"
    existing.write_text("{}")
    names = {"dir": tmp_path, "existing": existing}
    with pytest.raises(SystemExit, match=r"^grpokit eval: " + message.format(**names)):
        main(["eval", "model=tiny:arithmetic", "num_eval_examples=4", *(e.format(**names) for e in extra)])
    assert list(cache.iterdir()) == []  # refused before the cold start
    assert existing.read_text() == "{}"


def test_grpokit_eval_writes_its_output_whole_and_replaces_only_when_told(tiny_model_dir, tmp_path):
    out = tmp_path / "eval.json"
    argv = ["eval", f"model={tiny_model_dir}", "num_eval_examples=4", "max_new_tokens=4", "progress=false",
            f"output={out}", "per_example=true"]  # fmt: skip
    assert main(argv) == 0
    first = json.loads(out.read_text())
    assert len(first["records"]) == 4 and math.isfinite(first["accuracy"])
    assert main([*argv, "overwrite_output=true", "seed=1"]) == 0
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_the_manifest_says_what_the_run_is(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    assert main(cli(tiny_model_dir, out, "evaluate=false")) == 0
    record = manifest(out)
    assert record["kind"] == "train" and record["state"] == "finished" and record["step"] == 1
    assert len(record["config_hash"]) == 16 and record["pid"] == os.getpid() and record["model_saved"]
    assert (out / LOCK_FILE).exists() and folder_state(out).holder is None  # released
