"""engine=vllm on two trainer processes (`lmrl rl nproc=2`: torchrun, gloo; vLLM's CPU build, `make test-vllm`).

- colocated: every rank runs a vLLM engine of its own in its process and pushes its (DDP: replicated; FSDP: gathered)
  weights into it after every step;
- a server (vllm_server=auto): rank 0 starts it and takes its session, both ranks sample through it, rank 0 alone
  pushes the weights while the other waits;
- two replicas started for the run (vllm_replicas=2) with pushes over a gloo group (vllm_weight_transport=gloo):
  rank 0 starts both, forms the group and pushes to both; both ranks split their prompts across the replicas.
Both used to crash at start-up (the architecture was read from the wrapped class, "DDPLlamaForCausalLM"). Each run
checks that the engines sample the learner's weights: sampler_logp_gap stays at fp32 rounding on every step.
The ranks are fresh processes (the CLI starts torchrun), not forks of the test process: a fork of a process that
runs a vLLM engine (an earlier test module's) crashed.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import VLLM_TINY

if __import__("os").environ.get("LMRL_REQUIRE_VLLM"):
    import vllm  # noqa: F401
else:
    pytest.importorskip("vllm")

pytestmark = pytest.mark.vllm  # ~35-50 s each here (two engines start)


def train(out: Path, parallel: str, *overrides) -> subprocess.CompletedProcess:
    """`lmrl rl nproc=2 ...` in a subprocess (the reward's module on its path)."""
    here = Path(__file__).resolve().parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(here), str(here.parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    args = [
        f"output_dir={out}",
        f"parallel={parallel}",
        "engine=vllm",
        "precision=fp32",
        *VLLM_TINY,
        "task_args.digits=1",
        "train_rows=32",
        "eval_rows=4",
        "prompts_per_step=4",
        "samples_per_prompt=4",
        "max_new_tokens=6",
        "rewards=[dist_helpers:digit_fraction]",
        "eval_every=0",
        "save_every=0",
        "log_every=1",
        "lr=1e-2",
        "max_steps=3",
        "sample_every=100",
        "vllm_kv_cache_gb=0.0625",
        "vllm_max_model_len=128",
        "stop_on_sampler_logp_gap=true",
        "max_sampler_logp_gap=1e-3",
        *overrides,
    ]
    return subprocess.run(
        [sys.executable, "-m", "lmrl", "rl", "nproc=2", *args], env=env, capture_output=True, text=True, timeout=500
    )


@pytest.mark.parametrize(
    "parallel,overrides",
    [("fsdp", []), ("ddp", ["vllm_server=auto"]), ("ddp", ["vllm_replicas=2", "vllm_weight_transport=gloo"])],
    ids=["colocated-fsdp", "server-ddp", "replicas-gloo-ddp"],
)
def test_two_ranks_sample_with_engine_vllm_and_their_engines_follow_the_weights(tmp_path, parallel, overrides):
    done = train(tmp_path / "run", parallel, *overrides)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert len(steps) == 3 and all(r["time/weight_sync_s"] > 0 for r in steps)
    gaps = [r["policy/sampler_logp_gap"] for r in steps if "policy/sampler_logp_gap" in r]
    assert gaps and max(gaps) < 1e-4, gaps  # every rank's engine samples the weights after each update
