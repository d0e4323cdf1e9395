"""Sample tables show model output as it is: a pythonic tool call like ``[calculator(expression="2*3")]`` is text,
not rich markup (it vanished from every trainer's, `generate`'s and `eval`'s table before)."""

from __future__ import annotations

from lmrl import tracking

CALL = '[calculator(expression="2*3")]'


def test_a_tool_call_in_a_sample_is_printed_as_written(tmp_path):
    tracker = tracking.Tracker(tmp_path, total_steps=1)
    try:
        with tracker.progress.console.capture() as captured:
            tracker.log_samples(1, [{"prompt": "What is 2*3? [bold]", "completion": CALL, "reward": 1.0}])
    finally:
        tracker.close()
    text = "".join(captured.get().split())  # the table folds long cells over lines
    assert "".join(CALL.split()) in text and "[bold]" in text


def test_plain_cells_render_brackets():
    console = tracking.Console(width=200)
    with console.capture() as captured:
        console.print(tracking.plain(CALL))
    assert CALL in captured.get()
