"""Reward over-optimization on the built-in preference task: proxy RM score and gold score vs KL.

Gao et al. 2022 ("Scaling laws for reward model overoptimization"); RLHF book ch. 14 (spec
`rlhf-book-advanced.md` §7): optimise a policy against a learned proxy reward model and measure both the
proxy score and a held-out "gold" score against KL(π ‖ π_ref); the gold score peaks, then falls. Here the gold
score is exact: `lmrl.data.preference.gold_score`, the hidden rule that ranked the RM's training pairs.

1. π_ref: the built-in tiny model after SFT on every completion of the preference data (`lmrl sft`), so it
   samples the kinds of answers the pairs rank (right, near and far misses, verbose answers, junk);
2. proxy RM: the Bradley-Terry RM of `lmrl reward --config reward/tiny_prefs` (held-out pair accuracy ~0.78);
3. best-of-N for N = 1, 2, 4, ..., 256 against the proxy on held-out prompts. From one pool of P samples per
   prompt, the expected proxy and gold score of best-of-N are computed with the unbiased estimator
   `bon_expected` (Gao et al., appendix); KL(π_BoN ‖ π_ref) = log N − (N−1)/N (analytic), with the plug-in
   estimate `bon_kl_empirical` from the same pool shown next to it;
4. rejection sampling against the proxy (`lmrl rejection-sampling`, several rounds): proxy and gold score of
   each round's policy, and its KL(π ‖ π_ref) measured on sampled completions (k1, summed over tokens).
Writes `results.json` next to this script and the plot `docs/img/overoptimization.png` (x = sqrt KL).

    OMP_NUM_THREADS=1 python experiments/overoptimization/run.py            # ~6 min (240 s CPU) on 1 core
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from lmrl.algorithms.best_of_n import bon_expected, bon_kl_bound, bon_kl_empirical
from lmrl.config import load_config
from lmrl.data import preference as prefs
from lmrl.data.chat import render_prompt
from lmrl.models import load_model_and_tokenizer
from lmrl.rewards.reward_model import reward_model_reward
from lmrl.rollout.engines.hf import HFEngine, SamplingParams
from lmrl.tracking import read_jsonl

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


def build_policy(out: Path, steps: int) -> Path:
    """π_ref: SFT of builtin:tiny on all completions of builtin:prefs (the DPO quick start of docs/dpo.md)."""
    from lmrl.trainers.sft import trainer as sft

    data = out / "prefs_sft.jsonl"
    prefs.export_rows("builtin:prefs-sft", str(data), n=1000, seed=1)
    sft.train(
        load_config(
            sft.SFTConfig,
            None,
            [
                "model=builtin:tiny",
                f"dataset={data}",
                "train_rows=null",
                "max_length=64",
                "batch_size=32",
                "lr=3e-3",
                "warmup_steps=5",
                f"max_steps={steps}",
                "precision=fp32",
                "eval_every=0",
                "save_every=0",
                f"output_dir={out / 'sft'}",
                "overwrite=true",
            ],
        )
    )
    return out / "sft" / "final"


def build_proxy_rm(out: Path, rows: int, steps: int) -> tuple[Path, float]:
    """The proxy RM: `lmrl reward --config reward/tiny_prefs` on `rows` pairs for `steps` steps."""
    from lmrl.trainers.reward import trainer as reward

    result = reward.train(
        load_config(
            reward.RewardConfig,
            "reward/tiny_prefs",
            [
                f"train_rows={rows}",
                f"max_steps={steps}",
                "eval_every=0",
                "save_every=0",
                f"output_dir={out / 'proxy_rm'}",
                "overwrite=true",
            ],
        )
    )
    return out / "proxy_rm" / "final", result["eval/accuracy"]


@torch.no_grad()
def best_of_n_curve(policy: Path, rm: Path, pool_size: int, max_new_tokens: int, seed: int) -> dict:
    """Proxy and gold score of best-of-N (N = 1, 2, 4, ..., pool_size) on the distinct held-out prompts."""
    model, tokenizer = load_model_and_tokenizer(str(policy))
    rows = list({r["prompt"]: r for r in prefs.preference_rows(200, split="test")}.values())
    ids = [tokenizer(render_prompt(tokenizer, r["prompt"]), add_special_tokens=False)["input_ids"] for r in rows]
    engine = HFEngine(model, tokenizer)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0)
    batch = engine.generate(ids, params, n=pool_size, generator=torch.Generator().manual_seed(seed))
    proxy_fn = reward_model_reward(str(rm), batch_size=256, precision="fp32")
    proxy = torch.tensor(proxy_fn(batch.prompts, batch.completions, truncated=batch.truncated.tolist()))
    gold = torch.tensor(
        [
            prefs.gold_score(rows[k // pool_size]["prompt"], c, rows[k // pool_size]["meta"])
            for k, c in enumerate(batch.completions)
        ]
    )
    proxy, gold = proxy.view(len(rows), pool_size), gold.view(len(rows), pool_size)  # (M, P)
    points = []
    n = 1
    while n <= pool_size:
        points.append(
            {
                "n": n,
                "kl": bon_kl_bound(n),
                "kl_empirical": bon_kl_empirical(proxy, n).mean().item(),
                "proxy": bon_expected(proxy, proxy, n).mean().item(),
                "gold": bon_expected(proxy, gold, n).mean().item(),
                "gold_oracle": bon_expected(gold, gold, n).mean().item(),
            }
        )
        n *= 2
    return {"prompts": len(rows), "pool": pool_size, "points": points}


def rejection_curve(policy: Path, rm: Path, out: Path, rounds: int) -> list[dict]:
    """Rounds of rejection sampling against the proxy; per round: proxy, gold and KL to π_ref (held out)."""
    from lmrl.trainers.rejection import trainer as rejection

    rejection.train(
        load_config(
            rejection.RejectionConfig,
            "rejection/tiny_prefs_rm",
            [
                f"model={policy}",
                f"rewards=[model:{rm}]",
                f"rounds={rounds}",
                f"output_dir={out / 'rs'}",
                "overwrite=true",
                "save_every=0",
                "eval_samples=32",
            ],
        )
    )
    evals = [r for r in read_jsonl(out / "rs" / "metrics.jsonl") if "eval/gold_score" in r]
    return [
        {"round": r["step"], "kl": r.get("eval/kl", 0.0), "proxy": r["eval/reward"], "gold": r["eval/gold_score"]}
        for r in evals
    ]


def plot(results: dict, path: Path) -> None:
    """Three panels over sqrt KL: proxy score; gold score (zoomed); gold score next to best-of-N by gold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bon, rs = results["best_of_n"]["points"], results["rejection_sampling"]
    x = [p["kl"] ** 0.5 for p in bon]
    x_rs = [max(0.0, p["kl"]) ** 0.5 for p in rs]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.9))
    for ax, key, title in (
        (axes[0], "proxy", "proxy RM score (optimized)"),
        (axes[1], "gold", "gold score (hidden rule)"),
        (axes[2], "gold", "gold score, with best-of-N by gold"),
    ):
        ax.plot(x, [p[key] for p in bon], marker="o", label="best-of-N by proxy (analytic KL)")
        ax.plot(
            [p["kl_empirical"] ** 0.5 for p in bon],
            [p[key] for p in bon],
            ls=":",
            color="C0",
            alpha=0.7,
            label="same at the plug-in KL estimate",
        )
        for p, xi in zip(bon, x):
            ax.annotate(
                f"N={p['n']}" if p["n"] == 1 else str(p["n"]),
                (xi, p[key]),
                textcoords="offset points",
                xytext=(2, 5),
                fontsize=7,
            )
        ax.plot(x_rs, [p[key] for p in rs], marker="s", color="C3", label="rejection sampling rounds (sampled KL)")
        for p, xi in zip(rs, x_rs):
            ax.annotate(
                f"r{p['round']}", (xi, p[key]), textcoords="offset points", xytext=(2, -11), fontsize=7, color="C3"
            )
        ax.set_xlabel("sqrt KL(π ‖ π_ref)  [sqrt nats]")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[2].plot(x, [p["gold_oracle"] for p in bon], ls="--", color="gray", label="best-of-N by gold (oracle)")
    axes[2].legend(fontsize=7)
    fig.suptitle(
        f"Over-optimization on builtin:prefs: proxy RM (held-out pair accuracy "
        f"{results['proxy_rm_accuracy']:.2f}) vs the gold score, {results['best_of_n']['prompts']} "
        f"held-out prompts",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", default="runs/overoptimization", help="run directory for the models")
    parser.add_argument("--sft-steps", type=int, default=100)
    parser.add_argument("--rm-rows", type=int, default=2000, help="training pairs of the proxy RM")
    parser.add_argument("--rm-steps", type=int, default=400)
    parser.add_argument("--policy", help="reuse this π_ref (a final/ dir) instead of training it")
    parser.add_argument("--rm", help="reuse this proxy RM instead of training it (give --rm-accuracy too)")
    parser.add_argument("--rm-accuracy", type=float, default=float("nan"), help="held-out accuracy of --rm")
    parser.add_argument("--pool", type=int, default=512, help="samples per prompt; best-of-N up to N = pool / 2")
    parser.add_argument("--rs-rounds", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default=str(ROOT / "docs" / "img" / "overoptimization.png"))
    parser.add_argument("--replot", action="store_true", help="only redraw the plot from results.json")
    args = parser.parse_args()
    if args.replot:
        plot(json.loads((HERE / "results.json").read_text()), Path(args.plot))
        return
    torch.set_num_threads(1)
    out, t0 = Path(args.work), time.process_time()
    policy = Path(args.policy) if args.policy else build_policy(out, args.sft_steps)
    rm, accuracy = (Path(args.rm), args.rm_accuracy) if args.rm else build_proxy_rm(out, args.rm_rows, args.rm_steps)
    bon = best_of_n_curve(policy, rm, args.pool, args.max_new_tokens, args.seed)
    bon["points"] = [p for p in bon["points"] if p["n"] <= args.pool // 2]  # keep P >= 2N for the estimator
    results = {
        "args": vars(args),
        "proxy_rm_accuracy": accuracy,
        "best_of_n": bon,
        "rejection_sampling": rejection_curve(policy, rm, out, args.rs_rounds),
    }
    results["cpu_s"] = round(time.process_time() - t0, 1)
    (HERE / "results.json").write_text(json.dumps(results, indent=1))
    plot(results, Path(args.plot))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
