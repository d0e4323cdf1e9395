"""The evaluator behind `lmrl eval` and a trainer's ``eval_metrics``: one set of rows, the metrics named, any model.

    evaluator = Evaluator(["accuracy", "pass@8", "maj@8"], rows, EvalOptions(max_new_tokens=16), "task:arithmetic")
    metrics, samples = evaluator(model, tokenizer, dtype)

Everything that can fail on bad input (metric names, missing answer or choice columns, the reward model, judge
and baseline paths) fails in the constructor; the call only generates and scores. Formulas: `lmrl.eval.metrics`.
Tokens spent are reported next to the scores (spec §8: control for inference tokens): ``tokens/prompt`` (prompt
tokens run through the model, once per sample), ``tokens/generated`` (completion tokens of the evaluated model),
``tokens/baseline`` and ``tokens/judge`` (when judging).

Tool episodes: with an environment factory (``evaluator(model, tokenizer, env_factory=...)``, built from the
`tools`/`env`/`mcp_servers` keys by `lmrl.rollout.tools.section`) every completion is a multi-turn episode of
`lmrl.rollout.tools.multiturn.run_episodes` (the training-time tool loop), scored on its final answer; ``tools/<counter>
_per_episode`` are added, from the greedy episodes when there are any, else the sampled ones. `lmrl eval
tools=[...]`, a trainer's held-out tool accuracy (``eval/accuracy``) and its ``eval_metrics`` all run here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from lmrl.data.chat import encode_prompt
from lmrl.eval import metrics as M
from lmrl.eval.loglik import check_choice_rows, evaluate_choices
from lmrl.eval.spec import parse_metrics
from lmrl.eval.verify import check_rows, scorer
from lmrl.rollout.engines.hf import HFEngine, SamplingParams
from lmrl.rollout.tools.multiturn import MultiTurnOptions, run_episodes

Progress = Callable[[str, int, int], None]
"""progress(stage, done, total), called as work advances (the CLI draws bars with it)."""


@dataclasses.dataclass
class EvalOptions:
    max_new_tokens: int = 32
    temperature: float = 1.0  # sampled metrics (pass@k, maj@k, avg@k, pass^k)
    top_p: float = 1.0
    samples: int = 0  # samples per prompt for sampled metrics (0: the largest k)
    batch_size: int = 64  # prompts per generate call
    seed: int = 0
    chat: bool = True
    verifier: str = "auto"
    answer_column: str = "answer"
    reward_model: str | None = None
    judge: str | None = None
    baseline: str | None = None
    judge_max_new_tokens: int = 256
    num_samples: int = 4  # rows kept as sample records


class Evaluator:
    def __init__(
        self,
        names: Sequence[str],
        rows: list[dict[str, Any]],
        options: EvalOptions | None = None,
        source: str = "dataset",
        key: str = "metrics",
        turns: MultiTurnOptions | None = None,
    ):
        """``turns``: the options of tool episodes (run when the call gets an ``env_factory``)."""
        self.options = opts = options or EvalOptions()
        self.spec = parse_metrics(list(names), key)
        self.names, self.rows, self.source, self.turns = list(names), rows, source, turns
        if not rows:
            raise ValueError(f"{source}: no rows to evaluate.")
        if any("prompt" not in r for r in rows):
            bad = next(i for i, r in enumerate(rows) if "prompt" not in r)
            raise ValueError(f"{source}: row {bad} has no 'prompt' column (columns: {sorted(rows[bad])}).")
        self.n = max(opts.samples, self.spec.max_k)
        if self.spec.sampled and not (opts.temperature > 0 and 0 < opts.top_p <= 1):
            raise ValueError(
                f"sampled metrics need temperature > 0 and top_p in (0, 1]; got temperature="
                f"{opts.temperature}, top_p={opts.top_p}."
            )
        if opts.samples and opts.samples < self.spec.max_k:
            raise ValueError(f"samples={opts.samples} is fewer than the largest k ({self.spec.max_k}) of {key}.")
        if self.spec.needs_answers:
            check_rows(rows, opts.verifier, opts.answer_column, source)
        if self.spec.loglik:
            check_choice_rows(rows, source)
        self.score = scorer(opts.verifier, opts.answer_column)
        self.reward_fn = self.judge = self.baseline = None
        if self.spec.reward:
            if not opts.reward_model:
                raise ValueError(
                    f"'{key}' has 'reward': give the reward model with reward_model=PATH (a run's final/ "
                    "of `lmrl reward`)."
                )
            from lmrl.rewards.reward_model import reward_model_reward

            self.reward_fn = reward_model_reward(opts.reward_model)
        if self.spec.win_rate:
            self._load_judge(key)

    def _load_judge(self, key: str) -> None:
        opts = self.options
        if not opts.judge or not opts.baseline:
            raise ValueError(
                f"'{key}' has 'win_rate': give judge=PATH (the judge model) and baseline=PATH (the model "
                "whose answers are compared with the evaluated model's)."
            )
        from lmrl.models.setup import ModelSetup
        from lmrl.rewards.judge import PairwiseJudge

        setup = ModelSetup(seed=opts.seed)
        judge_model, self.judge_tokenizer = setup.judge(opts.judge)
        self.judge = PairwiseJudge(
            judge_model,
            self.judge_tokenizer,
            swap=True,
            max_new_tokens=opts.judge_max_new_tokens,
            autocast_dtype=setup.dtype,
        )
        self.baseline = setup.judge(opts.baseline)

    def __call__(
        self,
        model,
        tokenizer,
        dtype: torch.dtype | None = None,
        progress: Progress | None = None,
        engine=None,
        env_factory=None,
    ) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """The metrics (plain names: ``accuracy``, ``pass@8``, ``avg@8/std``, ``win_rate``, ``tokens/...``) and
        sample records of the first ``num_samples`` rows. ``engine``: the rollout engine that generates (default:
        an `HFEngine` on ``model``; `lmrl eval engine=vllm` passes a vLLM one). ``env_factory``: row ->
        environment; completions are then tool episodes (`self.turns`), a sample's completion its transcript."""
        opts, spec, rows = self.options, self.spec, self.rows
        out: dict[str, float] = {"rows": float(len(rows)), "tokens/prompt": 0.0, "tokens/generated": 0.0}
        samples = [{"prompt": r["prompt"]} for r in rows[: opts.num_samples]]
        episodes = (tokenizer, env_factory, self.turns or MultiTurnOptions()) if env_factory is not None else None
        if spec.needs_greedy_text or spec.sampled:
            engine = engine or HFEngine(model, tokenizer, autocast_dtype=dtype)
            ids = rows if episodes else [encode_prompt(tokenizer, r["prompt"], opts.chat) for r in rows]
        if spec.needs_greedy_text:
            greedy, infos = self._policy(engine, ids, 1, True, out, progress, "greedy", episodes)
            for rec, text in zip(samples, [info["transcript"] for info in infos] or greedy):
                rec["completion"] = text
            if spec.greedy:
                scores = [self.score(c, r)[1] for c, r in zip(greedy, rows)]
                out["accuracy"] = sum(scores) / len(scores)
                for rec, row, s in zip(samples, rows, scores):
                    rec.update(answer=row.get(opts.answer_column, row.get("answer")), score=s)
            if spec.reward:
                rewards = self.reward_fn([r["prompt"] for r in rows], greedy, truncated=[False] * len(rows))
                out["reward/mean"] = sum(rewards) / len(rewards)
                for rec, r in zip(samples, rewards):
                    rec["reward"] = r
            if spec.win_rate:
                self._judge(greedy, out, samples, progress)
        if spec.sampled:
            self._sampled(engine, ids, out, progress, episodes)
        if spec.loglik:
            done = (lambda i: progress("loglik", i, len(rows))) if progress else None
            scores, records = evaluate_choices(model, tokenizer, rows, opts.chat, dtype, done, opts.batch_size)
            out.update(scores)
            for rec, r in zip(samples, records):
                rec.update(choice=r["pick"], choice_norm=r["pick_norm"], gold=r["gold"])
        out["tokens/per_prompt"] = out["tokens/generated"] / len(rows)
        return out, samples

    def _generate(
        self,
        engine: HFEngine,
        ids: list,
        n: int,
        greedy: bool,
        progress: Progress | None,
        stage: str,
        episodes: tuple | None = None,
    ) -> tuple[list[str], int, int, list[dict]]:
        """Completions (prompt-major, n per prompt), the prompt tokens run (n per prompt), the tokens generated
        and, for tool episodes (``ids`` are then the rows), each episode's `run_episodes` info."""
        opts = self.options
        params = SamplingParams(
            max_new_tokens=opts.max_new_tokens,
            greedy=greedy,
            temperature=1.0 if greedy else opts.temperature,
            top_p=1.0 if greedy else opts.top_p,
        )
        generator = torch.Generator(device=engine.device).manual_seed(opts.seed)
        texts: list[str] = []
        infos: list[dict] = []
        prompt_tokens = generated = 0
        step = max(1, opts.batch_size // n)
        for start in range(0, len(ids), step):
            chunk = ids[start : start + step]
            if episodes:  # n episodes per row; tokens: the first prompt and the sampled turns of each
                tokenizer, env_factory, turns = episodes
                rep = [row for row in chunk for _ in range(n)]
                batch = run_episodes(engine, tokenizer, [env_factory(r) for r in rep], rep, params, turns, generator, n)
                infos += batch.info
                prompt_tokens += int(batch.prompt_mask.sum())
                generated += sum(end - begin for info in batch.info for begin, end in info["turns"])
            else:
                batch = engine.generate(chunk, params, n=n, generator=generator)
                prompt_tokens += n * sum(len(p) for p in chunk)
                generated += int(batch.completion_lengths.sum())
            texts += batch.completions
            if progress:
                progress(stage, min(start + step, len(ids)), len(ids))
        return texts, prompt_tokens, generated, infos

    def _policy(self, engine, ids, n, greedy, out, progress, stage, episodes=None) -> tuple[list[str], list[dict]]:
        """`_generate`, its tokens added to ``out`` (and the tool counters of the greedy episodes, else the sampled)."""
        texts, prompt_tokens, generated, infos = self._generate(engine, ids, n, greedy, progress, stage, episodes)
        out["tokens/prompt"] += prompt_tokens
        out["tokens/generated"] += generated
        if infos and (greedy or not any(k.startswith("tools/") for k in out)):
            keys = sorted({k for info in infos for k in info["stats"]})
            out.update({f"tools/{k}_per_episode": sum(i["stats"].get(k, 0) for i in infos) / len(infos) for k in keys})
        return texts, infos

    def _sample_scores(
        self, engine: HFEngine, ids: list, out: dict, progress: Progress | None, episodes: tuple | None = None
    ) -> tuple[list[list[float]], list[list[Any]]]:
        """Scores and parsed answers of n samples per prompt: (rows, n) each."""
        n, rows = self.n, self.rows
        texts, _ = self._policy(engine, ids, n, False, out, progress, f"{n} samples per prompt", episodes)
        scores, parsed = [], []
        for i, row in enumerate(rows):
            results = [self.score(texts[i * n + j], row) for j in range(n)]
            parsed.append([p for p, _ in results])
            scores.append([s for _, s in results])
        return scores, parsed

    def pass_rates(
        self, model, tokenizer, dtype: torch.dtype | None = None, progress: Progress | None = None
    ) -> tuple[list[float], dict[str, float]]:
        """Each row's mean score over n sampled completions (its pass rate with a 0/1 verifier), and the tokens
        spent; the difficulty filter's measure."""
        out = {"tokens/prompt": 0.0, "tokens/generated": 0.0}
        ids = [encode_prompt(tokenizer, r["prompt"], self.options.chat) for r in self.rows]
        scores, _ = self._sample_scores(HFEngine(model, tokenizer, autocast_dtype=dtype), ids, out, progress)
        return [sum(row) / len(row) for row in scores], out

    def _sampled(
        self, engine: HFEngine, ids: list, out: dict, progress: Progress | None, episodes: tuple | None = None
    ) -> None:
        """pass@k, pass^k, maj@k and avg@k (± std) from n samples per prompt."""
        scores, parsed = self._sample_scores(engine, ids, out, progress, episodes)
        n = self.n
        correct = [[s >= 1.0 for s in row] for row in scores]
        for kind, ks in self.spec.sampled.items():
            for k in ks:
                if kind == "pass":
                    out[f"pass@{k}"] = _mean(M.pass_at_k(n, sum(c), k) for c in correct)
                elif kind == "pass^":
                    out[f"pass^{k}"] = _mean(M.pass_hat_k(n, sum(c), k) for c in correct)
                elif kind == "maj":
                    out[f"maj@{k}"] = _mean(M.maj_at_k(p, c, k) for p, c in zip(parsed, correct))
                else:
                    mean, std = M.avg_at_k(scores, k)
                    out[f"avg@{k}"] = mean
                    if std is not None:
                        out[f"avg@{k}/std"] = std

    def _judge(self, greedy: list[str], out: dict, samples: list[dict], progress: Progress | None) -> None:
        """Win rate (and length-controlled) of the greedy answers against the baseline's greedy answers."""
        opts, rows = self.options, self.rows
        base_model, base_tok = self.baseline
        base_engine = HFEngine(base_model, base_tok, autocast_dtype=self.judge.generate.engine.autocast_dtype)
        base_ids = [encode_prompt(base_tok, r["prompt"], opts.chat) for r in rows]
        baseline, _, base_tokens, _ = self._generate(base_engine, base_ids, 1, True, progress, "baseline")
        out["tokens/baseline"] = float(base_tokens)
        verdicts = []
        chunk = max(1, opts.batch_size)
        judgements: list[str] = []
        for start in range(0, len(rows), chunk):
            sl = slice(start, start + chunk)
            verdicts += self.judge.judge([r["prompt"] for r in rows[sl]], greedy[sl], baseline[sl])
            judgements += self.judge.last_judgements
            if progress:
                progress("judge", min(start + chunk, len(rows)), len(rows))
        rate, judged = M.win_rate(verdicts)
        lc = M.lc_win_rate(verdicts, [len(t) for t in greedy], [len(t) for t in baseline])
        out.update(
            {
                "win_rate": _nan(rate),
                "lc_win_rate": _nan(lc),
                "judge/judged": float(judged),
                "judge/failures": float(len(verdicts) - judged),
                "judge/ties": float(sum(v == "tie" for v in verdicts)),
                "len/model_chars": _mean(len(t) for t in greedy),
                "len/baseline_chars": _mean(len(t) for t in baseline),
                "tokens/judge": float(
                    sum(len(self.judge_tokenizer(t, add_special_tokens=False)["input_ids"]) for t in judgements)
                ),
            }
        )
        for rec, base, verdict in zip(samples, baseline, verdicts):
            rec.update(baseline=base, verdict=verdict)


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def _nan(value: float | None) -> float:
    return float("nan") if value is None else value
