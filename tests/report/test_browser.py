"""The report and the dashboard in a real browser: headless Chromium (Debian's `chromium`) driven by Playwright.

Pages load without console errors, plots and tables show the run's numbers, the dashboard shows a metrics line
appended after the page loaded, and a screenshot of each page is kept in ``artifacts/browser/`` (or
``$LMRL_ARTIFACTS``). Chromium is the system package (`make test` installs it); Playwright never downloads a
browser here. Outside CI a machine without chromium or playwright skips these tests; in CI (CI set) they fail.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import EVAL_ACC, KLS, REWARDS

from lmrl.report.dashboard import DashboardConfig, serve
from lmrl.report.figures import ema
from lmrl.report.html import ReportConfig, run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(os.environ.get("LMRL_ARTIFACTS", Path(__file__).resolve().parents[2] / "artifacts" / "browser"))

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - the browser-test extra is not installed
    sync_playwright = None

missing = (
    "playwright (pip install -e '.[browser-test]')"
    if sync_playwright is None
    else "chromium (apt-get install -y chromium)"
    if CHROMIUM is None
    else None
)
if missing and os.environ.get("CI"):
    raise RuntimeError(f"browser tests need {missing}; `make test` installs both")
pytestmark = pytest.mark.skipif(missing is not None, reason=f"needs {missing}")


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.errors = []
    page.on("console", lambda m: page.errors.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    yield page
    page.close()


def plot_data(page, div_id: str) -> list[dict]:
    return page.evaluate(
        f"document.getElementById('{div_id}').data.map(t => ({{name: t.name, x: Array.from(t.x), y: Array.from(t.y)}}))"
    )


def test_report_in_browser(rl_run, page):
    html = run(ReportConfig(runs=[str(rl_run)]))
    page.goto(html.as_uri())
    page.wait_for_selector("#plot-reward .main-svg")
    traces = {t["name"]: t for t in plot_data(page, "plot-reward")}
    assert traces["reward/mean"]["y"] == REWARDS[1:]
    kl = {t["name"]: t for t in plot_data(page, "plot-reward-vs-kl")}
    assert kl["reward/mean"]["x"] == KLS[1:] and kl["eval/accuracy"]["y"] == [EVAL_ACC[4]]
    eval_table = page.inner_text("#eval-table")
    assert "eval/accuracy" in eval_table and str(EVAL_ACC[0]) in eval_table and str(EVAL_ACC[4]) in eval_table
    assert "46" in page.inner_text(".samples-table")  # a sample completion with its reward columns
    assert "rewards/task" in page.inner_text(".samples-table")
    assert "1 corrupt line(s)" in page.inner_text("body")
    assert page.errors == []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
    assert (ARTIFACTS / "report.png").stat().st_size > 10_000


def test_dashboard_in_browser_updates_live(runs_dir, page):
    server = serve(DashboardConfig(runs_dir=str(runs_dir), port=0, poll_ms=300))
    try:
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
        page.wait_for_selector("#runs-body tr[data-name='grpo-a']")
        assert "swarm-sim (swarm)" in page.inner_text("#runs-body")
        page.click("#runs-body tr[data-name='grpo-a']")
        page.wait_for_selector("#plot-loss .main-svg")
        loss = {t["name"]: t for t in plot_data(page, "plot-loss")}["loss"]
        assert loss["y"] == [1.0, 1 / 2, 1 / 3, 1 / 4] and loss["x"] == [1, 2, 3, 4]
        # a line appended after the page loaded shows up in the plot and the table
        with (runs_dir / "grpo-a" / "metrics.jsonl").open("a") as f:
            f.write(json.dumps({"step": 5, "loss": 0.123456, "reward/mean": 0.7, "kl": 0.3}) + "\n")
        page.wait_for_function("document.getElementById('plot-loss').data[0].y.includes(0.123456)", timeout=15_000)
        # the table refreshes on its own poll, which may come after the plot's
        page.wait_for_function(
            "document.querySelector(\"#runs-body tr[data-name='grpo-a']\").innerText.includes('0.1235')", timeout=15_000
        )
        assert "0.1235" in page.inner_text("#runs-body tr[data-name='grpo-a']")
        page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
        # the swarm view: nodes, rounds, accepted and rejected payloads
        page.click("#runs-body tr[data-name='swarm-sim']")
        page.wait_for_selector("#nodes-table td")
        nodes = page.inner_text("#nodes-table")
        assert "node-0" in nodes and "node-1" in nodes and "21" in nodes and "9" in nodes  # 7*3 accepted, 3*3 rejected
        page.wait_for_selector("#plot-swarm-swarm-accepted .main-svg")
        accepted = {t["name"]: t["y"] for t in plot_data(page, "plot-swarm-swarm-accepted")}
        assert accepted == {"node-0": [7, 14, 21], "node-1": [5, 10, 15]}
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard-swarm.png"), full_page=True)
        assert page.errors == []
    finally:
        server.shutdown()


def test_a_real_rl_run_with_nan_metrics_in_the_report_and_the_dashboard(garbled_rl_run, page):
    html = run(ReportConfig(runs=[str(garbled_rl_run)]))
    page.goto(html.as_uri())
    page.wait_for_selector("#plot-lr .main-svg")
    assert [t["name"] for t in plot_data(page, "plot-reward")] == ["reward/mean"]  # main: reward/std, reward/errors
    ticks = page.evaluate("Array.from(document.querySelectorAll('#plot-lr .ytick text')).map(t => t.textContent)")
    assert "1e\u22124" in ticks  # main: -1, -0.5, 0, 0.5, 1 (the constant lr 1e-4 drawn on 0)
    assert page.errors == []
    server = serve(DashboardConfig(runs_dir=str(garbled_rl_run.parent), port=0, poll_ms=300))
    try:
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
        page.wait_for_selector("#runs-body tr[data-name='grpo-garbled']")
        page.wait_for_selector("#plot-reward .main-svg")
        page.wait_for_timeout(1000)  # a few polls
        assert "unreachable" not in page.inner_text("#status")  # main: forever, once a run had a NaN metric
        assert "nan" in page.inner_text("#runs-body tr[data-name='grpo-garbled']")
        assert [t["name"] for t in plot_data(page, "plot-reward")] == ["reward/mean"]
        assert page.errors == []
    finally:
        server.shutdown()


def line_path(page, div_id: str) -> str:
    return page.evaluate(
        f"Array.from(document.querySelectorAll('#{div_id} .scatterlayer path.js-line'))"
        ".map(p => p.getAttribute('d')).join(' ')"
    )


def set_smoothing(page, value: float) -> None:
    page.evaluate(
        f"(() => {{ const s = document.getElementById('smoothing'); s.value = '{value}'; "
        "s.dispatchEvent(new Event('input')); })()"
    )


@pytest.mark.slow  # 8-12 s; the live dashboard itself stays in the default suite (test_dashboard_in_browser_updates_live)
def test_dashboard_keeps_zoom_and_hidden_lines_across_polls_and_smooths(runs_dir, page):
    server = serve(DashboardConfig(runs_dir=str(runs_dir), port=0, poll_ms=300))
    try:
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
        page.wait_for_selector("#runs-body tr[data-name='grpo-a']")
        assert "finished" in page.inner_text("#runs-body tr[data-name='grpo-a']")  # it wrote final/
        assert "running" in page.inner_text("#runs-body tr[data-name='swarm-sim']")  # no final/, just written
        page.click("#runs-body tr[data-name='grpo-a']")
        page.wait_for_selector("#plot-loss .main-svg")
        page.evaluate("Plotly.relayout('plot-loss', {'xaxis.range': [1.5, 3.5]})")  # what a drag-zoom does
        page.click("#plot-kl .legend .traces")  # hide kl, as a click on its legend entry does
        with (runs_dir / "grpo-a" / "metrics.jsonl").open("a") as f:
            f.write(json.dumps({"step": 5, "loss": 0.123456, "reward/mean": 0.7, "kl": 0.3, "time_s": 7.5}) + "\n")
        page.wait_for_function("document.getElementById('plot-loss').data[0].y.includes(0.123456)", timeout=15_000)
        page.wait_for_timeout(700)  # two more polls
        assert page.evaluate("document.getElementById('plot-loss').layout.xaxis.range") == [1.5, 3.5]
        assert page.evaluate("document.getElementById('plot-kl').data[0].visible") == "legendonly"
        raw = [1.0, 1 / 2, 1 / 3, 1 / 4, 0.123456]
        before = line_path(page, "plot-loss")
        set_smoothing(page, 0.6)
        drawn = plot_data(page, "plot-loss")
        assert [t["y"] for t in drawn] == [raw, pytest.approx(ema(raw, 0.6), rel=1e-12)]  # faint raw, then smoothed
        assert line_path(page, "plot-loss") != before
        assert page.evaluate("document.getElementById('plot-kl').data.map(t => t.visible)") == ["legendonly"] * 2
        page.wait_for_timeout(700)  # polls redraw smoothed, zoom kept
        assert len(plot_data(page, "plot-loss")) == 2
        assert page.evaluate("document.getElementById('plot-loss').layout.xaxis.range") == [1.5, 3.5]
        page.select_option("#xaxis", "time")
        assert plot_data(page, "plot-loss")[0]["x"] == [1.5, 3.0, 4.5, 6.0, 7.5]  # time_s, not steps
        page.check("#logy")
        assert page.evaluate("document.getElementById('plot-loss').layout.yaxis.type") == "log"
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard-controls.png"), full_page=True)
        assert page.errors == []
    finally:
        server.shutdown()


def test_report_plots_smooth_in_browser(rl_run, page):
    page.goto(run(ReportConfig(runs=[str(rl_run)])).as_uri())
    page.wait_for_selector("#plot-reward .main-svg")
    set_smoothing(page, 0.5)
    assert [t["y"] for t in plot_data(page, "plot-reward")] == [REWARDS[1:], pytest.approx(ema(REWARDS[1:], 0.5))]
    assert page.errors == []


# issue 47: the report and the dashboard open on the curves and fit a 1400 px wide window

WINDOW = {"width": 1400, "height": 900}
CURVES = ["reward", "accuracy", "loss", "kl", "completion_len"]


def widest(page) -> float:
    """The page's scroll width and the right edge of its widest table or plot panel, in CSS pixels."""
    return page.evaluate(
        "Math.max(document.documentElement.scrollWidth, ...Array.from(document.querySelectorAll('table, .dash-plot'))"
        ".map(e => e.getBoundingClientRect().right))"
    )


def tops(page, selectors: list[str]) -> list[float]:
    return page.evaluate(f"{json.dumps(selectors)}.map(s => document.querySelector(s).getBoundingClientRect().top)")


def panel_titles(page, container: str) -> list[str]:
    return page.evaluate(
        f"Array.from(document.querySelectorAll('{container} > .dash-plot')).map(d => d.layout.title.text)"
    )


def check_internal_counters(page, details: str, main: str) -> None:
    """Closed, below the curves, none of them among the curves; opened, its panels fit the page."""
    assert page.evaluate(f"document.querySelector('{details}').open") is False
    internal = panel_titles(page, f"{details} .plots")
    assert {"policy", "update", "time", "memory"} <= set(internal)
    assert not set(internal) & set(panel_titles(page, main))
    assert page.evaluate("document.getElementById('plot-policy').checkVisibility()") is False
    page.click(f"{details} summary")
    page.wait_for_timeout(500)
    assert page.evaluate("document.getElementById('plot-policy').checkVisibility()") is True
    box, svg = page.evaluate(
        "[document.getElementById('plot-policy').getBoundingClientRect().width, "
        "document.querySelector('#plot-policy .main-svg').getBoundingClientRect().width]"
    )
    assert 500 <= svg == pytest.approx(box, abs=2)  # the plot fills its panel


def check_samples(page, training: str, held_out: str) -> None:
    """Training rows (with their reward) and held-out rows (with answer and score) apart, chat markup as text."""
    shown = page.inner_text(training)
    assert "reward" in shown and "score" not in shown and "<|im" not in shown
    assert "user: " in shown and "system: Please reason step by step" in shown
    assert "answer" in page.inner_text(held_out) and "score" in page.inner_text(held_out)


def test_the_report_opens_on_the_curves_and_fits_a_1400_px_window(long_named_runs, page, tmp_path):
    page.set_viewport_size(WINDOW)
    page.goto(run(ReportConfig(runs=[str(long_named_runs[0])], output_file=str(tmp_path / "one.html"))).as_uri())
    page.wait_for_selector("#plot-reward .main-svg")
    assert panel_titles(page, "#metric-plots")[: len(CURVES)] == CURVES
    sections = ["#runs-table", "#metric-plots", "#plot-reward-vs-kl", "#internal-details", "#eval-table"]
    sections += [".training-samples", ".held-out-samples", "#config-details", "#checkpoints-table"]
    assert tops(page, sections) == sorted(tops(page, sections))
    assert page.evaluate("document.getElementById('plot-reward-vs-kl').data.every(t => t.mode === 'markers')")
    check_samples(page, ".training-samples", ".held-out-samples")
    assert widest(page) <= WINDOW["width"]
    page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    check_internal_counters(page, "#internal-details", "#metric-plots")
    assert widest(page) <= WINDOW["width"]
    page.screenshot(path=str(tmp_path / "report-internal-open.png"), full_page=True)
    page.goto(run(ReportConfig(runs=list(map(str, long_named_runs)), output_file=str(tmp_path / "two.html"))).as_uri())
    page.wait_for_selector("#plot-reward .main-svg")
    assert widest(page) <= WINDOW["width"]  # two runs: the runs, evaluation and config tables side by side
    page.screenshot(path=str(tmp_path / "report-compare.png"), full_page=True)
    assert all((tmp_path / f"{name}.png").stat().st_size > 10_000 for name in ("report", "report-compare"))
    assert page.errors == []


def test_the_dashboard_opens_on_the_curves_and_fits_a_1400_px_window(long_named_runs, page, tmp_path):
    page.set_viewport_size(WINDOW)
    server = serve(DashboardConfig(runs_dir=str(long_named_runs[0].parents[2]), port=0, poll_ms=300))
    try:
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
        name = str(long_named_runs[0].relative_to(long_named_runs[0].parents[2]))
        page.click(f"#runs-body tr[data-name='{name}']")
        page.wait_for_selector("#plot-reward .main-svg")
        page.wait_for_selector("#training-samples td")
        assert panel_titles(page, "#plots")[: len(CURVES)] == CURVES
        assert panel_titles(page, "#plots")[-1].startswith("reward and held-out scores vs KL")  # as in the report
        sections = ["#runs-table", "#plots", "#internal-details", "#training-samples", "#held-out-samples"]
        assert tops(page, [*sections, "#checkpoints-table"]) == sorted(tops(page, [*sections, "#checkpoints-table"]))
        check_samples(page, "#training-samples", "#held-out-samples")
        assert widest(page) <= WINDOW["width"]
        page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
        check_internal_counters(page, "#internal-details", "#plots")
        page.wait_for_timeout(700)  # polls redraw the opened section at its size
        assert widest(page) <= WINDOW["width"]
        page.screenshot(path=str(tmp_path / "dashboard-internal-open.png"), full_page=True)
        assert (tmp_path / "dashboard.png").stat().st_size > 10_000
        assert page.errors == []
    finally:
        server.shutdown()
