"""The model-support table of docs/models.md, made from the model-matrix tests' own results.

    python tests/models/support_table.py        # runs the matrix tests (slow ones included), rewrites the table

With ``LMRL_SUPPORT_TABLE=<file>`` set, each matrix test appends its outcome (`conftest.py`) and what it measured
(`record`) to that file as JSON lines; `render` turns them into one row per architecture.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "models.md"
BEGIN, END = "<!-- support-table:begin -->", "<!-- support-table:end -->"
TESTS = ["tests/models/test_architectures.py", "tests/models/test_model_verbs.py"]


def record(arch: str, check: str, **values) -> None:
    """Append what a test measured for (arch, check), when a table is being made."""
    path = os.environ.get("LMRL_SUPPORT_TABLE")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"arch": arch, "check": check, **values}, default=str) + "\n")


LABELS = {
    "test_grpo_runs_with_every_speed_up_used_and_final_loads_in_transformers": "rl grpo, final/ loads",
    "test_lora_grpo_with_gradient_checkpointing": "rl grpo lora + checkpointing",
    "test_ppo": "rl ppo",
    "test_sft": "sft",
    "test_dpo": "dpo",
    "test_eval": "eval",
}


def render(lines: list[dict]) -> str:
    """Markdown: a row per architecture, a column per check, ✓ / ✗ from the tests' outcomes and the largest
    sampler/learner gap each architecture showed."""
    outcomes: dict[str, dict[str, list[bool]]] = {}
    gaps: dict[str, float] = {}
    for line in lines:
        if "outcome" in line:
            outcomes.setdefault(line["arch"], {}).setdefault(line["check"], []).append(line["outcome"] == "passed")
        elif "gap" in line:
            gaps[line["arch"]] = max(gaps.get(line["arch"], 0.0), float(line["gap"]))
    checks = list(dict.fromkeys(c for row in outcomes.values() for c in row))
    out = [
        "| architecture | " + " | ".join(LABELS.get(c, c) for c in checks) + " | max fp32 sampler/learner gap |",
        "|---" * (len(checks) + 2) + "|",
    ]
    for arch, row in outcomes.items():
        cells = [("✓" if all(row[c]) else "✗") if c in row else "" for c in checks]
        out.append(f"| {arch} | " + " | ".join(cells) + f" | {gaps.get(arch, float('nan')):.1e} |")
    return "\n".join(out)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "results.jsonl"
        env = {**os.environ, "LMRL_SUPPORT_TABLE": str(results)}
        code = subprocess.call(
            [sys.executable, "-m", "pytest", "-q", "-m", "slow or not slow", *TESTS], cwd=ROOT, env=env
        )
        lines = [json.loads(x) for x in results.read_text().splitlines()] if results.exists() else []
    import transformers

    table = (
        render(lines) + "\n\nMade by `python tests/models/support_table.py` with transformers "
        f"{transformers.__version__}."
    )
    text = DOC.read_text()
    head, rest = text.split(BEGIN)
    DOC.write_text(head + BEGIN + "\n" + table + "\n" + END + rest.split(END)[1])
    print(table)
    return code


if __name__ == "__main__":
    sys.exit(main())
