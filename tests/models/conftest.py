"""The model-matrix tests report their outcomes for docs/models.md (`support_table.py`)."""

import json
import os

import pytest

COLUMNS = {"option": None, "verb": None}  # the parameter that names a test's column


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    path = os.environ.get("LMRL_SUPPORT_TABLE")
    params = getattr(getattr(item, "callspec", None), "params", {})
    if not path or "arch" not in params or (report.when != "call" and not report.failed):
        return
    column = next((str(params[k]) for k in COLUMNS if k in params), item.originalname)
    if item.originalname.startswith("test_every_option_gives"):
        column = f"{column} gradients"
    with open(path, "a") as f:
        f.write(json.dumps({"arch": params["arch"], "check": column, "outcome": report.outcome}) + "\n")


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M-Instruct from `make smollm2`: (model in eval mode, tokenizer); the test is skipped without it."""
    from lmrl.models import gguf
    from lmrl.models.loading import load_model_and_tokenizer

    try:
        path = gguf.smollm2_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    model, tokenizer = load_model_and_tokenizer(str(path))
    return model.eval(), tokenizer
