"""resolve_reward: callables, built-in names, factories with arguments, import paths, errors."""

import pytest

from grpokit.rewards import (
    BUILTIN_REWARDS,
    accuracy_reward,
    code_execution_reward,
    resolve_reward,
    think_format_reward,
)


def my_reward(prompts, completions, completion_ids, **kwargs):
    return [1.0] * len(completions)


def make_my_reward(value=1.0):
    def constant(prompts, completions, completion_ids, **kwargs):
        return [value] * len(completions)

    return constant


def test_callables_pass_through():
    assert resolve_reward(my_reward) is my_reward
    with pytest.raises(ValueError, match="keyword arguments"):
        resolve_reward(my_reward, scale=2)


def test_builtin_names_give_default_instances():
    assert resolve_reward("accuracy") is accuracy_reward
    assert resolve_reward("accuracy_reward") is accuracy_reward
    assert resolve_reward("think_format") is think_format_reward
    assert resolve_reward("code_execution") is code_execution_reward
    assert resolve_reward("repetition_penalty").__name__ == "repetition_penalty_reward"
    assert resolve_reward("answer_format")(["p"], ["<think>a</think><answer>b</answer>"], [[1]]) == [1.0]


def test_builtin_factories_take_keyword_arguments():
    overlong = resolve_reward("soft_overlong_punishment", max_completion_len=4, soft_punish_cache=2)
    assert overlong(["p"] * 2, ["c"] * 2, [[1, 1, 1], [1] * 5]) == [-0.5, -1.0]
    think = resolve_reward("think_format", prefix="<think>")
    assert think(["p"], ["a</think>b"], [[1]]) == [1.0]
    assert resolve_reward("accuracy", extract="boxed", name="boxed_acc").__name__ == "boxed_acc"
    with pytest.raises(ValueError, match="needs arguments"):
        resolve_reward("soft_overlong_punishment")


def test_mapping_spec_as_written_in_a_yaml_recipe():
    spec = {"name": "soft_overlong_punishment", "max_completion_len": 4, "soft_punish_cache": 2}
    assert resolve_reward(spec)(["p"], ["c"], [[1, 1, 1]]) == [-0.5]
    with pytest.raises(ValueError, match="'name'"):
        resolve_reward({"max_completion_len": 4})


@pytest.mark.parametrize("spec", [f"{__name__}:my_reward", f"{__name__}.my_reward"])
def test_import_paths(spec):
    assert resolve_reward(spec) is my_reward


def test_import_path_factory_with_arguments():
    reward = resolve_reward(f"{__name__}:make_my_reward", value=0.25)
    assert reward(["p"], ["c"], [[1]]) == [0.25]


def test_unknown_names_list_the_builtins():
    with pytest.raises(ValueError, match=r"accuracy.*code_execution"):
        resolve_reward("acuracy")
    with pytest.raises(ValueError, match="not a built-in"):
        resolve_reward("no_such_package.reward")
    with pytest.raises(ValueError, match="has no attribute"):
        resolve_reward(f"{__name__}:missing")
    with pytest.raises(ValueError, match="callable or a string"):
        resolve_reward(3)
    assert {"accuracy", "think_format", "soft_overlong_punishment", "code_execution"} <= set(BUILTIN_REWARDS)


def test_soft_overlong_punishment_takes_the_runs_length_unless_given():
    """DAPO eq. 13 with M = max_completion_length = 10 and C = M // 5 = 2: 0 up to 8 tokens, then
    (M - C - L) / C down to -1 at M, -1 beyond."""
    from grpokit.rewards import resolve_rewards

    (reward,) = resolve_rewards(["soft_overlong_punishment"], max_completion_length=10)
    ids = [[1] * n for n in (8, 9, 10, 11)]
    assert reward(prompts=[""] * 4, completions=[""] * 4, completion_ids=ids) == [0.0, -0.5, -1.0, -1.0]
    (given,) = resolve_rewards(
        [{"name": "soft_overlong_punishment", "max_completion_len": 10, "soft_punish_cache": 5}],
        max_completion_length=99,
    )
    assert given(prompts=[""] * 2, completions=[""] * 2, completion_ids=[[1] * 5, [1] * 7]) == [0.0, -0.4]
