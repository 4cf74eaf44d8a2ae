"""pytest plugin that run.sh loads on both sides (TRL and grpokit); TRL's test files stay unedited.

1. It bridges TRL's test helpers to the installed TRL 1.16.0 package: the vendored ``testing_utils.py``
   imports ``trl.import_utils.is_joblib_available``, which TRL 1.16.0 does not define; it is added (true
   when joblib is installed).
2. A test that would run (TRL's own skip marks come first) but loads a Hub model or data set for which
   ``standins.py`` built no stand-in (e.g. GPU-only models: SmolVLM-Instruct) is skipped with the reason
   ``stand-in not built: <ids>``, so it is counted apart from real failures.

Nothing here touches GRPOConfig or GRPOTrainer.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
from pathlib import Path

import pytest
import standins

NOT_BUILT = "stand-in not built"
_HUB_ID = re.compile(r"""["']((?:trl-internal-testing|HuggingFaceTB|Qwen|meta-llama|google)/[\w.\-]+)["']""")


def _bridge_trl_import_utils() -> None:
    import trl.import_utils as import_utils

    if not hasattr(import_utils, "is_joblib_available"):
        import_utils.is_joblib_available = lambda: importlib.util.find_spec("joblib") is not None


_bridge_trl_import_utils()


def _hub_ids(item) -> tuple[set[str], set[str]]:
    """Hub ids in this item's parameters, and in its test function's body."""
    params, body_ids = set(), set()
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        for value in callspec.params.values():
            if isinstance(value, str):
                params.update(_HUB_ID.findall(repr(value)))
    try:
        source = inspect.getsource(item.function)
    except (OSError, TypeError):
        return params, body_ids
    # The body only: the decorators list every parametrized id, not just this item's.
    body = source[source.find("def ") :] if "def " in source else source
    body_ids.update(_HUB_ID.findall(body))
    return params, body_ids


def _missing(ids: set[str]) -> list[str]:
    hf_home = Path(os.environ.get("HF_HOME", standins.DEFAULT_HF_HOME))
    missing = []
    for repo_id in sorted(ids):
        if repo_id.startswith(f"{standins.ORG}/zen"):
            built = standins.is_dataset_built(hf_home, repo_id)
        else:
            built = standins.is_model_built(hf_home, repo_id)
        if not built:
            missing.append(repo_id)
    return missing


@pytest.hookimpl(trylast=True)
def pytest_runtest_setup(item):
    # trylast: TRL's own skip marks (accelerator, vLLM, liger, ...) are evaluated first and win.
    params, body_ids = _hub_ids(item)
    if params:
        # A parametrized item loads its own parameter and the data sets its body names; other model ids in
        # the body are conditions on the parameter (test_train_vlm names tiny-LlavaForConditionalGeneration
        # in an `if model_id in (...)` without that being one of its parameters).
        datasets = {i for i in body_ids if i.startswith(f"{standins.ORG}/zen")}
        missing = _missing(params) + _missing(datasets)
    else:
        missing = _missing(body_ids)
    if missing:
        pytest.skip(f"{NOT_BUILT}: {', '.join(missing)}")
