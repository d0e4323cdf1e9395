"""A config error answers before any heavy import (issue 33): `lmrl.cli` imports a verb's config from a module
without torch or transformers, and its trainer only once the config checked. No wall clock here: the test checks
which modules a failing command imported (torch alone takes seconds to import)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

from lmrl.cli import VERBS, _config_class

HEAVY = ("torch", "transformers")

PROBE = """
import json, sys
from lmrl.cli import main
out = []
for args in json.loads(sys.argv[1]):
    rc = main(args)
    out.append([args, rc, sorted(m for m in HEAVY if m in sys.modules)])
print("RESULT" + json.dumps(out))
""".replace("HEAVY", repr(HEAVY))


def run_cli(cases: list[list[str]], tmp_path) -> list:
    """Run each case through `lmrl.cli.main` in one fresh interpreter; the heavy modules imported after each."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(cases)], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT")), None)
    assert line, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(line[len("RESULT") :])


def test_a_bad_key_fails_before_torch_is_imported_for_every_verb(tmp_path):
    cases = [[verb, "bogus_key=1"] for verb in VERBS]
    for args, rc, heavy in run_cli(cases, tmp_path):
        assert rc == 2, args
        assert heavy == [], f"`lmrl {' '.join(args)}` imported {heavy} before its config error"


def test_bad_values_and_paths_fail_before_torch_is_imported(tmp_path):
    (tmp_path / "file").write_text("x")
    cases = [
        ["sft", "--config", "missing.yaml"],
        ["rl", "lr=-1"],
        ["dpo", "batch_size=0"],
        ["rl", "kl_coef=nan"],
        ["sft", f"output_dir={tmp_path / 'file'}"],
        ["pretrain", "block_size=x"],
    ]
    for args, rc, heavy in run_cli(cases, tmp_path):
        assert rc == 2, args
        assert heavy == [], f"`lmrl {' '.join(args)}` imported {heavy} before its config error"


def test_the_written_out_defaults_match_their_sources():
    """Two configs write out values whose source imports torch: pretrain's avatarl defaults and swarm's sampler
    names (for `peer_sampling`'s help)."""
    from lmrl.algorithms import AvatarlOptions
    from lmrl.swarm.config import PEER_SAMPLER_NAMES
    from lmrl.swarm.sampling import PEER_SAMPLERS
    from lmrl.trainers.pretrain.config import PretrainConfig

    config = PretrainConfig()
    for f in dataclasses.fields(AvatarlOptions):
        if f.name != "ignore_index":
            assert getattr(config, f.name) == getattr(AvatarlOptions(), f.name), f.name
    assert set(PEER_SAMPLER_NAMES) == {n for n in PEER_SAMPLERS.names() if not n.startswith("test_")}


def test_a_missing_data_path_fails_before_torch_is_imported_for_every_training_verb(tmp_path):
    """The bad path of issue 33 (`lmrl rl|dpo dataset=./missing.jsonl`): every verb with a `dataset` key."""
    verbs = [v for v in VERBS if "dataset" in {f.name for f in dataclasses.fields(_config_class(VERBS[v]))}]
    assert {"sft", "rl", "dpo", "reward", "distill", "rejection-sampling", "eval"} <= set(verbs)
    for args, rc, heavy in run_cli([[verb, "dataset=./missing.jsonl"] for verb in verbs], tmp_path):
        assert rc == 2, args
        assert heavy == [], f"`lmrl {' '.join(args)}` imported {heavy} before its config error"
