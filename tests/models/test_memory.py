"""CPU memory settings (lmrl.models.memory): huge pages measured as used, in fresh processes (PyTorch reads its
setting once, at its first large allocation, so the pytest process itself cannot show it)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmrl.models import memory
from lmrl.tracking import read_jsonl


def thp_mode() -> str:
    """The kernel's transparent huge page mode: always, madvise or never ('' without THP support)."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return ""
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else ""


needs_thp = pytest.mark.skipif(
    thp_mode() not in ("always", "madvise"), reason="the kernel has no transparent huge pages"
)


def fresh_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != memory.HUGE_PAGES_VARIABLE}


@needs_thp
def test_use_huge_pages_puts_large_tensors_on_huge_pages_in_a_fresh_process():
    code = (
        "import sys, torch\n"
        "from lmrl.models import memory\n"
        "on = memory.use_huge_pages() if sys.argv[1] == 'on' else False\n"
        "x = torch.ones(16 * 2**20)\n"  # 64 MiB, touched
        "print(on, memory.huge_page_mib())\n"
    )
    result = {}
    for mode in ("on", "off"):
        out = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, env=fresh_env())
        assert out.returncode == 0, out.stderr[-2000:]
        flag, mib = out.stdout.split()
        result[mode] = (flag == "True", float(mib))
    assert result["on"][0] is True and result["on"][1] >= 32  # most of the 64 MiB on 2 MiB pages
    if thp_mode() == "madvise":  # only what PyTorch asks for gets huge pages
        assert result["off"][1] < 8


@needs_thp
def test_a_training_run_logs_its_huge_pages_and_peak_memory(tmp_path):
    """`lmrl sft` on a model with 4 MiB weights: memory/huge_pages_mib > 0 with the default huge_pages=true
    (the settings apply before the model loads), and memory/peak_rss_mib is the process's peak."""
    model = ["model_args.hidden_size=512", "model_args.intermediate_size=2048", "model_args.num_hidden_layers=2"]
    args = ["sft", f"output_dir={tmp_path}", *model, "max_steps=2", "eval_every=0", "batch_size=2"]
    result = subprocess.run(
        [sys.executable, "-m", "lmrl", *args], capture_output=True, text=True, timeout=300, env=fresh_env()
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    logged = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "memory/huge_pages_mib" in r]
    assert [r["step"] for r in logged] == [1, 2]
    assert all(r["memory/huge_pages_mib"] >= 4 for r in logged)
    assert all(200 < r["memory/peak_rss_mib"] < 8000 for r in logged)


def test_step_metrics_read_this_process():
    metrics = memory.step_metrics()
    if os.path.exists("/proc/self/status"):
        assert metrics["memory/peak_rss_mib"] >= memory.resident_bytes() / 2**20 - 1
        assert metrics["memory/huge_pages_mib"] >= 0
