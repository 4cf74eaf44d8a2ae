"""RewardModel: a tiny sequence-classification model loaded from disk scores prompt + completion."""

import os

import pytest
import torch

from grpokit.rewards import RewardModel, resolve_reward


@pytest.fixture(scope="module")
def reward_model(reward_model_dir):
    return RewardModel(reward_model_dir, batch_size=2)


def direct_score(model: RewardModel, text: str) -> float:
    ids = model.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model.model(input_ids=ids).logits[0, 0].item()


def test_scores_equal_unbatched_forward_passes(reward_model):
    prompts = ["1+1=", "2+2=", "a longer prompt here: ", "x"]
    completions = ["2", "5", "ok", "a much longer completion than the others"]
    scores = reward_model(prompts, completions, None)
    assert len(scores) == 4 and all(isinstance(score, float) for score in scores)
    expected = [direct_score(reward_model, p + c) for p, c in zip(prompts, completions)]
    assert scores == pytest.approx(expected, abs=1e-5)  # right padding + batching change nothing
    assert len(set(scores)) == 4


def test_conversational_rows_use_the_chat_template(reward_model):
    prompt = [{"role": "user", "content": "1+1="}]
    completion = [{"role": "assistant", "content": "2"}]
    text = reward_model.text(prompt, completion)
    expected_text = reward_model.tokenizer.apply_chat_template(prompt + completion, tokenize=False)
    assert text == expected_text == "1+1=2" + reward_model.tokenizer.eos_token
    assert reward_model([prompt], [completion]) == pytest.approx([direct_score(reward_model, text)], abs=1e-5)


def test_frozen_and_named(reward_model, reward_model_dir):
    assert reward_model.__name__ == reward_model_dir.name == "tiny-rm"
    assert not reward_model.model.training
    assert not any(p.requires_grad for p in reward_model.model.parameters())
    assert reward_model.device == torch.device("cpu")
    assert reward_model.to("cpu") is reward_model


def test_truncation_keeps_the_end(reward_model_dir):
    model = RewardModel(reward_model_dir, max_length=5)
    assert model(["aaaaaaaaaa"], ["bcdef"]) == pytest.approx([direct_score(model, "bcdef")], abs=1e-5)


def test_loaded_module_needs_a_tokenizer(reward_model):
    with pytest.raises(ValueError, match="tokenizer"):
        RewardModel(reward_model.model)
    named = RewardModel(reward_model.model, reward_model.tokenizer)
    assert named.__name__ == "Qwen2ForSequenceClassification"
    with pytest.raises(ValueError, match="prompts"):
        named(["a"], ["b", "c"])


def test_resolve_reward_loads_a_model_directory(reward_model_dir):
    model = resolve_reward(str(reward_model_dir), batch_size=4)
    assert isinstance(model, RewardModel) and model.batch_size == 4


def test_resolve_reward_loads_a_hub_id_from_the_local_cache_offline(reward_model_dir, tmp_path):
    """A reward model named by its Hub id (as TRL takes it: ``reward_funcs="org/name"``) loads from the
    local Hugging Face cache with the Hub offline; its scores equal the model directory's; an id that is in
    no cache is refused naming what was tried."""
    import json
    import shutil
    import subprocess
    import sys

    snapshot = tmp_path / "hub" / "models--someone--tiny-rm" / "snapshots" / "0123abcd"
    shutil.copytree(reward_model_dir, snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0123abcd")
    script = (
        "import json; from grpokit.rewards import resolve_reward\n"
        "rm = resolve_reward('someone/tiny-rm')\n"
        "scores = rm(prompts=['1+1='], completions=['2'], completion_ids=[[0]])\n"
        "try:\n    resolve_reward('someone/missing-rm')\nexcept ValueError as e:\n    error = str(e)\n"
        "print(json.dumps({'name': rm.__name__, 'scores': scores, 'error': error}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    local = resolve_reward(str(reward_model_dir))
    assert seen["name"] == "tiny-rm"
    assert seen["scores"] == pytest.approx(local(prompts=["1+1="], completions=["2"], completion_ids=[[0]]))
    assert "'someone/missing-rm'" in seen["error"] and "Hub model id" in seen["error"]


def test_a_loaded_model_and_reward_processing_classes_as_trl_passes_them(reward_model_dir, tmp_path):
    """TRL's forms: a loaded sequence-classification model in reward_funcs (named after its source, scored
    with its own tokenizer), and reward_processing_classes giving each reward model's tokenizer (None for a
    plain function); a count that does not match is refused."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from grpokit.rewards import resolve_rewards

    loaded = AutoModelForSequenceClassification.from_pretrained(reward_model_dir)
    by_dir = resolve_reward(str(reward_model_dir))
    (from_object,) = resolve_rewards([loaded])
    args = {"prompts": ["1+1="], "completions": ["2"], "completion_ids": [[0]]}
    assert from_object.__name__ == "tiny-rm"
    assert from_object(**args) == pytest.approx(by_dir(**args))

    def plain(prompts, completions, **kwargs):
        return [0.5] * len(completions)

    other = AutoTokenizer.from_pretrained(reward_model_dir)  # a tokenizer object of the caller's
    funcs = resolve_rewards([plain, str(reward_model_dir)], processing_classes=[None, other])
    assert funcs[0] is plain and funcs[1].tokenizer is other
    assert funcs[1](**args) == pytest.approx(by_dir(**args))
    with pytest.raises(ValueError, match=r"reward_processing_classes: 1 given for 2 reward function"):
        resolve_rewards([plain, str(reward_model_dir)], processing_classes=[other])


def test_a_grpokit_outcome_model_scores_probabilities(reward_model):
    """An outcome model trained by ``grpokit train-rm`` (``grpokit_reward_kind: outcome``) scores the sigmoid
    of its logit, as the iterative reward model does; ``output`` chooses either explicitly."""
    import copy
    import math

    model = copy.deepcopy(reward_model.model)
    model.config.grpokit_reward_kind = "outcome"
    logit = direct_score(reward_model, "1+1=2")
    grpokit_rm = RewardModel(model, reward_model.tokenizer)
    assert grpokit_rm.output == "prob"
    assert grpokit_rm(["1+1="], ["2"]) == pytest.approx([1 / (1 + math.exp(-logit))], abs=1e-6)
    raw = RewardModel(model, reward_model.tokenizer, output="logit")
    assert raw(["1+1="], ["2"]) == pytest.approx([logit], abs=1e-5)
    assert reward_model.output == "logit"  # any other sequence classifier: its logit
    with pytest.raises(ValueError, match="output must be 'logit' or 'prob', got 'sigmoid'"):
        RewardModel(model, reward_model.tokenizer, output="sigmoid")
