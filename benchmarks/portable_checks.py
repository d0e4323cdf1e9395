"""The start-up checks on a model under this process's CPU settings: each comparison's difference and rounding bound.

    python benchmarks/portable_checks.py                      # SmolLM2-135M-Instruct when `make smollm2` installed it
    python benchmarks/portable_checks.py --model PATH         # any HF causal LM folder or GGUF file
    ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 python benchmarks/portable_checks.py --json out.json

`make test-portable` runs it under each kernel and thread setting (docs/reliability.md, "Determinism"). Checks:
causality (`lmrl.models.support`), the chunked LM head (`lmrl.models.head.head_agreement`), packed rows
(`lmrl.data.packing.packed_forward_agreement`), the fused RMSNorm/SwiGLU/GELU (`lmrl.models.fused`, the worst module
of each kind) and the packed bf16 linears (`lmrl.models.packed.reproduces`, per weight shape). Prints one line per
check; exits 1 when a check refuses the model or switches a speed-up off.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lmrl.data.packing import packed_forward_agreement  # noqa: E402
from lmrl.models import fused, packed, usage  # noqa: E402
from lmrl.models.head import decoder_and_head, head_agreement  # noqa: E402
from lmrl.models.support import check_causal_lm  # noqa: E402


def load(path: str | None):
    from lmrl.models.loading import load_model_and_tokenizer

    if path is None:
        from lmrl.models.gguf import smollm2_path

        try:
            path = str(smollm2_path())
        except Exception:  # noqa: BLE001 - not installed: the built-in tiny Llama
            path = "builtin:tiny"
    model, _ = load_model_and_tokenizer(path)
    return path, model.eval()


def settings() -> dict:
    return {
        "ATEN_CPU_CAPABILITY": torch.backends.cpu.get_cpu_capability(),
        "ONEDNN_MAX_CPU_ISA": os.environ.get("ONEDNN_MAX_CPU_ISA", "(all)"),
        "threads": torch.get_num_threads(),
        "oneDNN bf16": packed.available(),
    }


def run_checks(model) -> dict[str, dict]:
    results = {}
    causal = check_causal_lm(model, "model")
    results["causal"] = {"difference": causal.difference, "bound": causal.bound, "ok": bool(causal)}
    parts = decoder_and_head(model, verified=True)
    if parts is not None:
        head = head_agreement(model, parts)
        results["chunked_head"] = {"difference": head.difference, "bound": head.bound, "ok": bool(head)}
    vocab = model.get_input_embeddings().num_embeddings
    rows = packed_forward_agreement(model, vocab)
    results["packed_rows"] = {"difference": rows.difference, "bound": rows.bound, "ok": bool(rows)}
    for kind, outcome in fused_agreements(model).items():
        results[f"fused_{kind}"] = {"difference": outcome.difference, "bound": outcome.bound, "ok": bool(outcome)}
    if packed.available():
        shapes = {(m.out_features, m.in_features, m.bias is not None) for m in model.modules() if packed._packable(m)}
        passed = [packed.reproduces(*shape) for shape in sorted(shapes)]
        results["packed_linear"] = {"shapes": len(passed), "ok": all(passed), "passed": sum(passed)}
    return results


def fused_agreements(model) -> dict:
    """The worst module of each fusable kind (the check `fuse_layers` makes before it swaps a forward)."""
    worst = {}
    for module in model.modules():
        candidate = fused.fusion_candidate(module)
        if candidate is None:
            continue
        kind, forward, width = candidate
        with usage.quiet():
            outcome = fused._reproduces(module, forward, width)
        if kind not in worst or outcome.difference * worst[kind].bound > worst[kind].difference * outcome.bound:
            worst[kind] = outcome
    return worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="an HF causal LM (default: SmolLM2 if installed, else tiny)")
    parser.add_argument("--json", default=None, help="append the results as one JSON line to this file")
    args = parser.parse_args()
    path, model = load(args.model)
    results = run_checks(model)
    setting = settings()
    print(f"model {path}; {', '.join(f'{k}={v}' for k, v in setting.items())}")
    for name, r in results.items():
        shown = (
            f"differs by {r['difference']:.3g}, rounding allows {r['bound']:.3g}"
            if "difference" in r
            else f"{r['passed']} of {r['shapes']} weight shapes"
        )
        print(f"  {name:16s} {'ok ' if r['ok'] else 'OFF'} {shown}")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps({"model": path, "settings": setting, "checks": results}) + "\n")
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
