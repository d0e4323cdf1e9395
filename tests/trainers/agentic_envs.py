"""Environments for the multi-turn trainer tests (imported by path: env=agentic_envs:digits)."""

from lmrl.rollout.tools.env import StepResult


class DigitsEnv:
    """Two assistant turns with user feedback between; each turn is rewarded by its share of digit characters."""

    tools = []

    def reset(self, row):
        self.turns = 0
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, message):
        self.turns += 1
        text = message["content"]
        reward = sum(c.isdigit() for c in text) / max(1, len(text))
        if self.turns == 2:
            return StepResult([], reward, done=True)
        return StepResult([{"role": "user", "content": "more"}], reward)


def digits(row):
    return DigitsEnv()
