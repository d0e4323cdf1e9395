"""Figures of docs/reliability.md: flooding, fetch memory, absurd updates, changed-lr resume.

    OMP_NUM_THREADS=1 python benchmarks/reliability.py --out /tmp/reliability

Each figure compares the rule on this branch with the one it replaced (re-implemented here in two lines where
it was a one-liner: the uniform `max_peer_groups` subset).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from lmrl import cli
from lmrl.swarm.memory import FileHub, MemoryTransport
from lmrl.swarm.sampling import fair_share
from lmrl.trainers import common

TINY = [
    "model_args.hidden_size=32",
    "model_args.num_hidden_layers=1",
    "model_args.intermediate_size=64",
    "model_args.num_attention_heads=2",
    "precision=fp32",
    "task_args.digits=1",
    "train_rows=32",
    "eval_rows=4",
    "batch_size=4",
    "eval_every=0",
    "warmup_steps=0",
    "lr_schedule=constant",
    "log_every=1",
]


def flooding(rounds: int = 1000, flooders: int = 16, per_flooder: int = 64, cap: int = 64) -> dict[str, float]:
    """Share of rounds in which an honest peer's one group is among the `cap` groups considered."""
    owners = [f"flood-{f}" for f in range(flooders) for _ in range(per_flooder)] + ["honest"]
    uniform = fair = 0
    for r in range(rounds):
        g = torch.Generator().manual_seed(r)
        uniform += len(owners) - 1 in torch.randperm(len(owners), generator=g)[:cap].tolist()
        fair += len(owners) - 1 in fair_share(owners, cap, torch.Generator().manual_seed(r))
    return {"uniform_subset": uniform / rounds, "fair_share": fair / rounds}


def fetch_bytes(out: Path, peers: int = 200, size: int = 1_500_000) -> dict[str, float]:
    """Bytes one fetch returns from a file hub holding `peers` entries of `size` bytes."""
    hub = FileHub(out / "hub", max_entry_bytes=size + 1)
    for i in range(peers):
        hub.put(0, f"peer-{i:03d}", b"x" * size)
    got = MemoryTransport(hub, "me").fetch(0)
    return {
        "peers_held": peers,
        "held_mib": peers * size / 2**20,
        "peers_returned": len(got),
        "returned_mib": sum(len(d) for _, d in got) / 2**20,
    }


def absurd_lr(out: Path) -> dict[str, object]:
    """A run resumed with lr=1e6: exit code and the newest checkpoint left."""
    run = out / "absurd"
    cli.main(["sft", f"output_dir={run}", *TINY, "max_steps=2", "overwrite=true"])
    code = cli.main(
        [
            "sft",
            f"output_dir={run}",
            *TINY,
            "max_steps=4",
            "lr=1e6",
            "save_every=1",
            "resume=true",
            "max_grad_norm=null",
        ]
    )
    return {"exit_code": code, "newest_checkpoint": common.checkpoint_step(common.latest_checkpoint(run))}


def resume_lr(out: Path) -> dict[str, float]:
    """lr logged after `resume=true lr=1e-5` of a run trained at 3e-3."""
    run = out / "lr"
    cli.main(["sft", f"output_dir={run}", *TINY, "max_steps=2", "lr=3e-3", "overwrite=true"])
    cli.main(["sft", f"output_dir={run}", *TINY, "max_steps=3", "lr=1e-5", "resume=true"])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {f"lr_step_{r['step']}": r["lr"] for r in rows if "lr" in r and r["step"] >= 2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/lmrl-reliability")
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    figures = {
        "flooding": flooding(),
        "fetch": fetch_bytes(out),
        "absurd_lr": absurd_lr(out),
        "resume_lr": resume_lr(out),
    }
    print(json.dumps(figures, indent=1))
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
