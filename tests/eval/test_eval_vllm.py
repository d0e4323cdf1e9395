"""`lmrl eval engine=vllm` (vLLM's CPU build, `make test-vllm`): the vLLM engine generates what the HF engine does
(greedy completions token for token, so the same accuracy) and samples pass@k's completions."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "rollout"))
from vllm_helpers import require_vllm  # noqa: E402

require_vllm()

from lmrl.config import load_config  # noqa: E402
from lmrl.eval import cli as eval_cli  # noqa: E402
from tests.helpers import VLLM_TINY  # noqa: E402

pytestmark = pytest.mark.vllm


def evaluate(tmp_path, engine):
    out = tmp_path / f"{engine}.json"
    config = load_config(
        eval_cli.EvalConfig,
        None,
        [
            "model=builtin:tiny",
            *VLLM_TINY,
            "precision=fp32",
            "dataset=task:arithmetic",
            "task_args.digits=1",
            "rows=12",
            "metrics=[accuracy,pass@4]",
            "max_new_tokens=8",
            "num_samples=12",
            f"engine={engine}",
            "vllm_kv_cache_gb=0.0625",
            "vllm_max_model_len=128",
            f"output_file={out}",
        ],
    )
    metrics = eval_cli.run(config)
    return metrics, json.loads(out.read_text())["samples"]


def test_eval_with_vllm_generates_what_the_hf_engine_does(tmp_path):
    hf, hf_samples = evaluate(tmp_path, "hf")
    vllm, vllm_samples = evaluate(tmp_path, "vllm")
    assert [s["completion"] for s in vllm_samples] == [s["completion"] for s in hf_samples]  # greedy, all 12 rows
    assert vllm["accuracy"] == hf["accuracy"]
    assert vllm["tokens/prompt"] == hf["tokens/prompt"]
    assert 0 <= vllm["pass@4"] <= 1 and vllm["tokens/generated"] > 0
