"""The complete environment example of docs/environments.md runs as printed, with the hub name replaced by a
local tiny model and a one-step budget, and its environment behaves as documented."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "environments.md"


def doc_example() -> str:
    section = DOC.read_text().split("## Your own environment, complete", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_documented_environment_trains(tiny_model_dir, tmp_path):
    code = doc_example()
    assert len(code.strip().splitlines()) <= 40
    replacements = {
        '"Qwen/Qwen2.5-0.5B-Instruct"': repr(str(tiny_model_dir)),
        'output_dir="guess-grpo",': f"output_dir={str(tmp_path / 'run')!r}, max_steps=1, disable_tqdm=True,",
    }
    for old, new in replacements.items():
        assert old in code
        code = code.replace(old, new)
    namespace: dict = {}
    exec(compile(code, str(DOC), "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.step == 1 and trainer.reward_names == ["environment_reward"]
    env = namespace["GuessTheNumber"]()
    env.reset({"secret": 7})
    assert env.step("3").observation == " higher\n" and env.step("9").observation == " lower\n"
    last = env.step(" 7")
    assert last.done and last.reward == 1.0 - 0.1 * 2
    assert env.step("seven").info == {"invalid": 1}
