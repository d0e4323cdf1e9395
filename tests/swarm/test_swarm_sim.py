"""`lmrl swarm`: the N-node simulation end to end, its metrics, resume, warm start, config checks, and
`mode=join` over a shared folder (and over hivemind on loopback when it is installed)."""

import importlib.util
import json
import math
from types import SimpleNamespace

import pytest
import torch

from lmrl.config import RECIPES_DIR, ConfigError, load_config
from lmrl.models import load_model
from lmrl.swarm import FileHub, MemoryTransport, Payload, QuestionGroup, encode
from lmrl.swarm.cli import ROUND_EPOCH, run, swarm_round
from lmrl.swarm.config import SwarmConfig
from lmrl.swarm.sim import node_specs, plot_sim, swarm_metrics, warm_start_model
from lmrl.tracking import read_jsonl
from tests.helpers import TINY, digit_fraction, register_once

register_once("test_swarm_digits", digit_fraction)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture
def no_plots(monkeypatch):
    """Skip the end-of-run plots (matplotlib costs seconds per run); the end-to-end test keeps them."""
    import lmrl.swarm.sim
    import lmrl.tracking

    monkeypatch.setattr(lmrl.tracking, "plot_metrics", lambda *a, **k: [])
    monkeypatch.setattr(lmrl.swarm.sim, "plot_sim", lambda *a, **k: None)


def config(tmp_path, *overrides, name="run"):
    return load_config(
        SwarmConfig,
        None,
        [
            f"output_dir={tmp_path / name}",
            "precision=fp32",
            *TINY,
            "max_new_tokens=5",
            "samples_per_prompt=3",
            "nodes=4",
            "local=2",
            "external=2",
            "lr=1e-2",
            "max_steps=2",
            "log_every=1",
            "save_every=0",
            "rewards=[test_swarm_digits]",
            "tasks=[arithmetic, reverse]",
            *overrides,
        ],
    )


def test_four_node_sim_runs_end_to_end_and_every_node_trains(tmp_path, no_plots):
    cfg = config(tmp_path, "eval_rows=1")
    summary = run(cfg)
    out = tmp_path / "run"
    init = load_model("builtin:tiny", seed=cfg.seed, model_args=cfg.model_args)  # every node's starting point
    for i in range(4):
        final = load_model(str(out / "nodes" / f"node-{i}" / "final"))
        same = [n for (n, p), q in zip(final.named_parameters(), init.parameters()) if torch.equal(p, q)]
        assert same == [], f"node-{i}: parameters unchanged: {same}"
    per_node = {f"node-{i}": read_jsonl(out / "nodes" / f"node-{i}" / "metrics.jsonl") for i in range(4)}
    assert all([r["step"] for r in recs] == [1, 2] for recs in per_node.values())
    for name, recs in per_node.items():  # cumulative reward = running sum of the node's own mean reward
        assert recs[-1]["reward/cumulative"] == pytest.approx(sum(r["reward/mean"] for r in recs))
        assert summary["cumulative_reward_per_node"][name] == pytest.approx(recs[-1]["reward/cumulative"])
        assert all(r["swarm/peers"] == 3 and r["swarm/groups/peer_candidates"] == 6 for r in recs)  # 3 peers x 2 groups
        assert all(r["swarm/skipped"] == 0 for r in recs)
    assert summary["cumulative_reward"] == pytest.approx(sum(summary["cumulative_reward_per_node"].values()))
    swarm = [r for r in read_jsonl(out / "metrics.jsonl") if "swarm/cumulative_reward" in r]
    assert [r["step"] for r in swarm] == [1, 2]
    assert swarm[-1]["swarm/cumulative_reward"] == pytest.approx(summary["cumulative_reward"])
    assert swarm[-1]["swarm/accepted"] == 4 * 3 * 2  # 4 nodes x 3 peers x 2 rounds
    assert summary["reward_per_round"][0] == pytest.approx(sum(r[0]["reward/mean"] for r in per_node.values()) / 4)
    assert math.isfinite(summary["final_eval"]["eval/accuracy"]) and "initial_eval" in summary
    assert (out / "swarm_summary.json").exists()


def test_plot_sim_draws_each_nodes_cumulative_reward(tmp_path):
    nodes = []
    for name in ("node-0", "node-1"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text('{"step": 1, "reward/cumulative": 0.5}\n')
        nodes.append(SimpleNamespace(name=name, dir=tmp_path / name))
    assert plot_sim(tmp_path, nodes) == tmp_path / "plots" / "swarm_reward.png"
    assert (tmp_path / "plots" / "swarm_reward.png").stat().st_size > 0


def test_swarm_metrics_sum_counters_and_average_the_rest():
    per_node = {
        "a": {
            "reward/mean": 0.5,
            "reward/cumulative": 2.0,
            "swarm/accepted": 3,
            "swarm/skipped": 1,
            "swarm/skipped/bad_msgpack": 1,
            "loss": 0.2,
        },
        "b": {
            "reward/mean": 0.25,
            "reward/cumulative": 1.0,
            "swarm/accepted": 2,
            "swarm/skipped": 0,
            "loss": 0.4,
            "entropy": 1.0,
        },
    }
    m = swarm_metrics(per_node)
    # means: reward (0.5 + 0.25) / 2 = 0.375, loss 0.3, entropy only on b: 1.0; sums: 3.0, 5, 1, 1
    assert m["reward/mean"] == pytest.approx(0.375) and m["loss"] == pytest.approx(0.3) and m["entropy"] == 1.0
    assert m["swarm/cumulative_reward"] == 3.0 and m["swarm/accepted"] == 5 and m["swarm/skipped"] == 1
    assert m["swarm/skipped/bad_msgpack"] == 1 and "reward/cumulative" not in m
    assert m["node/a/reward/mean"] == 0.5 and m["node/b/reward/cumulative"] == 1.0 and "node/a/entropy" not in m


def test_node_specs_cycle_models_and_group_sizes(tmp_path):
    cfg = config(
        tmp_path,
        "nodes=5",
        "node_model_args=[{hidden_size: 32}, {hidden_size: 64}]",
        "node_samples_per_prompt=[2, 4, 8]",
    )
    specs = node_specs(cfg)
    assert [s.model_args["hidden_size"] for s in specs] == [32, 64, 32, 64, 32]
    assert [s.samples_per_prompt for s in specs] == [2, 4, 8, 2, 4]
    assert [s.name for s in specs] == [f"node-{i}" for i in range(5)] and len({s.seed for s in specs}) == 5


def test_heterogeneous_swarm_with_file_hub(tmp_path, no_plots):
    cfg = config(
        tmp_path,
        "nodes=3",
        "hub=file",
        "node_model_args=[{hidden_size: 32, num_hidden_layers: 1}, "
        "{hidden_size: 48, num_hidden_layers: 2, intermediate_size: 96, num_attention_heads: 2}]",
        "node_samples_per_prompt=[2, 3]",
        "max_steps=1",
    )
    summary = run(cfg)
    rounds = sorted((tmp_path / "run" / "hub").glob("round-*"))
    assert len(rounds) == 1 and len(list(rounds[0].iterdir())) == 3  # one file per node
    recs = [read_jsonl(tmp_path / "run" / "nodes" / f"node-{i}" / "metrics.jsonl")[-1] for i in range(3)]
    assert [r["swarm/groups/peer_candidates"] for r in recs] == [4, 4, 4] and all(r["swarm/skipped"] == 0 for r in recs)
    assert len(summary["cumulative_reward_per_node"]) == 3


def test_sim_resume_matches_an_uninterrupted_run(tmp_path, no_plots):
    full = run(config(tmp_path, "nodes=2", name="full"))
    run(config(tmp_path, "nodes=2", "max_steps=1", name="cut"))  # the final save of step 1 is the checkpoint
    resumed = run(config(tmp_path, "nodes=2", "resume=true", name="cut"))
    assert resumed["cumulative_reward_per_node"] == full["cumulative_reward_per_node"]
    assert resumed["reward_per_round"] == full["reward_per_round"]
    assert [r["step"] for r in read_jsonl(tmp_path / "cut" / "nodes" / "node-0" / "metrics.jsonl")] == [1, 2]


def test_warm_start_trains_once_and_is_reused(tmp_path, monkeypatch, no_plots):
    cfg = config(tmp_path, "warm_start_steps=2", "warm_start_rows=8", "warm_start_batch_size=4")
    path = warm_start_model(cfg, cfg.model, cfg.model_args, tmp_path / "cache")
    model = load_model(path)
    assert model.config.hidden_size == 32
    import lmrl.trainers.sft.trainer as sft

    monkeypatch.setattr(sft, "train", lambda *a, **k: pytest.fail("the cached warm start must be reused"))
    assert warm_start_model(cfg, cfg.model, cfg.model_args, tmp_path / "cache") == path
    other = config(tmp_path, "warm_start_steps=3", "warm_start_rows=8", "warm_start_batch_size=4")
    monkeypatch.undo()
    assert warm_start_model(other, other.model, other.model_args, tmp_path / "cache") != path
    assert warm_start_model(config(tmp_path), "builtin:tiny", {}, tmp_path / "cache") == "builtin:tiny"  # off


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["local=4", "questions_per_round=2"], "questions_per_round"),
        (["local=0", "external=0"], "never train"),
        (["tasks=[arithmetic, algebra]"], "unknown task 'algebra'"),
        (["peer_sampling=random"], "peer_sampling"),
        (["mode=join", "transport=file"], "hub_dir"),
        (["algorithm=rloo", "node_samples_per_prompt=[1, 4]"], "rloo needs samples_per_prompt >= 2"),
        (["samples_per_prompt=1"], "grpo needs samples_per_prompt >= 2"),
        (["external=-1"], "'external' must be >= 0"),
        (["nproc=2"], "lmrl swarm runs one process per node"),
    ],
)
def test_config_errors_name_the_key(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        config(tmp_path, *overrides)


def test_clock_rounds():
    cfg = load_config(SwarmConfig, None, ["round_seconds=60"])
    assert swarm_round(cfg, 7, now=ROUND_EPOCH + 125) == 2  # floor(125 / 60)
    assert swarm_round(cfg, 7, now=ROUND_EPOCH - 5) == 0
    assert swarm_round(load_config(SwarmConfig), 7) == 7  # round_seconds=0: rounds are steps


def test_shipped_recipes_load():
    for path in sorted((RECIPES_DIR / "swarm").glob("*.yaml")):
        cfg = load_config(SwarmConfig, str(path))
        assert cfg.max_steps >= 1 and cfg.local + cfg.external == 8


def test_join_over_a_shared_folder_trains_on_peers_and_resumes(tmp_path, no_plots):
    hub_dir = tmp_path / "hub"
    peer = MemoryTransport(FileHub(hub_dir), "peer")
    for r in (1, 2):
        peer.publish(r, encode(Payload("peer", "m", r, [QuestionGroup("2+2=", "4", "arithmetic", {}, ["4", "x1"])])))
    common = ["mode=join", "transport=file", f"hub_dir={hub_dir}", "node_name=me", "nodes=1"]
    metrics = run(config(tmp_path, *common, "max_steps=1", name="me"))
    assert metrics["swarm/accepted"] == 1 and metrics["swarm/groups/external"] == 1 and metrics["swarm/round"] == 1
    assert (tmp_path / "me" / "final" / "config.json").exists()
    resumed = run(config(tmp_path, *common, "max_steps=2", "resume=true", name="me"))
    assert resumed["swarm/accepted"] == 2 and resumed["swarm/round"] == 2  # counters restored, one more round
    assert {e.name for e in (hub_dir / f"round-{2:012d}").iterdir()} == {
        b"peer".hex() + ".msgpack",
        b"me".hex() + ".msgpack",
    }


@pytest.mark.slow  # ~15 s: starting the libp2p daemon
@pytest.mark.skipif(importlib.util.find_spec("hivemind") is None, reason="hivemind is not installed")
def test_join_over_hivemind_on_loopback(tmp_path, no_plots):
    metrics = run(
        config(tmp_path, "mode=join", "host_maddrs=[/ip4/127.0.0.1/tcp/0]", "max_steps=1", "nodes=1", name="hm")
    )
    assert (
        metrics["swarm/accepted"] == 0 and metrics["swarm/groups/trained"] >= 0
    )  # alone in a new swarm: own groups only
    assert (tmp_path / "hm" / "swarm.key").exists()  # the identity is kept for restarts
    assert json.loads(json.dumps(metrics))  # plain numbers


def test_sim_killed_mid_round_resumes_from_its_last_checkpoint_exactly(tmp_path, monkeypatch, no_plots):
    """A crash in round 3 (node-1 dies while training; checkpoints every 2 rounds): resume=true restarts
    every node from step 2, re-runs round 3, and ends exactly where an uninterrupted run ends."""
    import lmrl.swarm.node

    full = run(config(tmp_path, "nodes=3", "max_steps=4", "save_every=2", name="full"))
    train = lmrl.swarm.node.SwarmNode.train

    def dies_in_round_3(self, own, step, rounds):
        if self.name == "node-1" and step == 3:
            raise RuntimeError("killed")
        return train(self, own, step, rounds)

    monkeypatch.setattr(lmrl.swarm.node.SwarmNode, "train", dies_in_round_3)
    with pytest.raises(RuntimeError, match="killed"):
        run(config(tmp_path, "nodes=3", "max_steps=4", "save_every=2", name="cut"))
    assert read_jsonl(tmp_path / "cut" / "nodes" / "node-0" / "metrics.jsonl")[-1]["step"] == 2
    monkeypatch.setattr(lmrl.swarm.node.SwarmNode, "train", train)
    generate, generated = lmrl.swarm.node.SwarmNode.generate, []

    def spy(self, step, round):
        generated.append(step)
        return generate(self, step, round)

    monkeypatch.setattr(lmrl.swarm.node.SwarmNode, "generate", spy)
    resumed = run(config(tmp_path, "nodes=3", "max_steps=4", "save_every=2", "resume=true", name="cut"))
    assert generated == [3, 3, 3, 4, 4, 4]  # restarted from step-2, not from scratch
    assert resumed["cumulative_reward_per_node"] == full["cumulative_reward_per_node"]
    assert resumed["reward_per_round"] == full["reward_per_round"]
    for i in range(3):
        assert [r["step"] for r in read_jsonl(tmp_path / "cut" / "nodes" / f"node-{i}" / "metrics.jsonl")] == [
            1,
            2,
            3,
            4,
        ]
        a = load_model(str(tmp_path / "full" / "nodes" / f"node-{i}" / "final"))
        b = load_model(str(tmp_path / "cut" / "nodes" / f"node-{i}" / "final"))
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters())), f"node-{i}"
