"""grpokit: Group Relative Policy Optimization for language models.

from grpokit import GRPOConfig, GRPOTrainer
trainer = GRPOTrainer(model="path/or/hub-id", reward_funcs=[fn], args=GRPOConfig(...),
                      train_dataset=rows)
trainer.train(); trainer.save_model(path)
"""

from grpokit.config import BatchPlan, GRPOConfig

__version__ = "0.1.0"

__all__ = ["BatchPlan", "GRPOConfig", "GRPOTrainer", "RolloutBatch", "__version__"]


def __getattr__(name: str):
    # The trainer pulls in transformers/accelerate; import it only when asked for (fast `import grpokit`).
    if name == "GRPOTrainer":
        from grpokit.train.trainer import GRPOTrainer

        return GRPOTrainer
    if name == "RolloutBatch":
        from grpokit.rollout.records import RolloutBatch

        return RolloutBatch
    raise AttributeError(f"module 'grpokit' has no attribute {name!r}")
