"""The trainer's boundary (docs/architecture.md): a helper gets what it needs and returns what it makes.

Read from the source, like the layer test: no module outside ``train/`` assigns an attribute of a trainer
(``trainer.correction = ...``), no function below the command line takes a ``trainer`` parameter (the
command line builds the trainer and may hold it), and ``train/`` holds the step's modules only. Each check is
tested on planted code that breaks it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import grpokit

PACKAGE = Path(grpokit.__file__).parent

STEP_MODULES = {
    "__init__",
    "trainer",  # GRPOTrainer: training_step, the loop around it
    "batch",  # Samples -> Scores -> RolloutBatch
    "forward",  # the log-prob forward
    "lm_head",  # its chunked LM head
    "reference",  # pi_ref
    "update",  # mu epochs of optimizer steps
    "prompts",  # which prompts, as token ids
    "preflight",  # a run's checks that need no weights, before any load
    "run_rewards",  # what scores a run
    "schedule",  # when a run logs, evaluates, saves
    "hooks",  # the protocol of optional behaviour
    "process_supervision",  # hooks: process rewards, an environment's turn rewards
    "iterative_grpo",  # hook: the reward model that keeps learning
    "entropy_control",  # hook: the entropy bonus's coefficient, adapted per optimizer step
    "selfplay",  # hook: a game's role-wise advantages, role baselines, selfplay/* metrics
    "evaluation",  # the GRPO loss of evaluation samples (eval_loss)
}
"""``train/``'s modules: the step and nothing else."""

ABOVE_THE_TRAINER = {"cli"}
"""Rooms that build a trainer and may pass it around."""


def trainer_attribute_assignments(tree: ast.AST) -> list[int]:
    """Lines assigning (``=``, ``+=``, annotated) an attribute of a name ``trainer`` or ``t``, or calling
    ``setattr(trainer, ...)``."""
    lines = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            targets = [ast.Attribute(value=node.args[0], attr="?")] if node.args else []
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.Attribute) and _names_trainer(part.value):
                    lines.append(node.lineno)
    return lines


def _names_trainer(node: ast.expr) -> bool:
    """``trainer``, ``t``, or an attribute chain starting from one (``trainer.iterative.reference``)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id in ("trainer", "t")


def trainer_parameters(tree: ast.AST) -> list[int]:
    """Lines of functions with a parameter named ``trainer``."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            arguments = node.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
            every += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
            if any(a.arg == "trainer" for a in every):
                lines.append(node.lineno)
    return lines


def room_of(path: Path, root: Path) -> str:
    parts = path.relative_to(root).parts
    return parts[0] if len(parts) > 1 else ""


def reaches(root: Path) -> list[str]:
    """``file:line: what`` for every assignment to a trainer outside ``train/`` and every ``trainer``
    parameter below the command line."""
    found = []
    for path in sorted(root.rglob("*.py")):
        room, tree = room_of(path, root), ast.parse(path.read_text())
        where = path.relative_to(root.parent)
        if room != "train":
            assigned = trainer_attribute_assignments(tree)
            found += [f"{where}:{line}: assigns a trainer attribute" for line in assigned]
        if room not in ABOVE_THE_TRAINER:
            found += [f"{where}:{line}: takes a trainer" for line in trainer_parameters(tree)]
    return found


def test_no_helper_reaches_into_the_trainer():
    assert reaches(PACKAGE) == []


def test_train_holds_only_the_step():
    modules = {p.stem for p in (PACKAGE / "train").glob("*.py")}
    assert modules == STEP_MODULES
    assert not [p for p in (PACKAGE / "train").iterdir() if p.is_dir() and p.name != "__pycache__"]


@pytest.mark.parametrize(
    ("room", "code", "what"),
    [
        ("sampling", "def f(x):\n    trainer = x\n    trainer.correction = 1\n", "assigns a trainer"),
        ("sampling", "def f(x):\n    t = x\n    t.iterative.reference = 2\n", "assigns a trainer attribute"),
        ("reporting", "def f(x):\n    setattr(trainer, 'step', 3)\n", "assigns a trainer attribute"),
        ("sampling", "class D:\n    def __init__(self, trainer):\n        pass\n", "takes a trainer"),
        ("reporting", "def f(*, trainer=None):\n    pass\n", "takes a trainer"),
    ],
)  # fmt: skip
def test_a_planted_reach_is_found(tmp_path, room, code, what):
    root = tmp_path / "grpokit"
    (root / room).mkdir(parents=True)
    (root / room / "planted.py").write_text(code)
    found = reaches(root)
    assert found and all(what in line for line in found), found


def test_the_trainer_sets_its_own_attributes_and_the_cli_may_hold_one(tmp_path):
    root = tmp_path / "grpokit"
    for room, code in [
        ("train", "class T:\n    def f(self):\n        trainer = self\n        trainer.step = 1\n"),
        ("cli", "def run(trainer):\n    return trainer.train()\n"),  # the command line holds the trainer
        ("sampling", "def f(self, trainers):\n    self.trainer = trainers\n"),  # other names
    ]:
        (root / room).mkdir(parents=True)
        (root / room / "allowed.py").write_text(code)
    assert reaches(root) == []
