"""Dataset loading (built-in tasks, local files, HF datasets) and row schema checks.

Every problem is reported at start-up as one ValueError that names the source,
the row and the fix: missing columns (naming the columns found), malformed
JSONL lines (1-based line number), bad role orders, empty completions.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence
from typing import Any, Literal

from lmrl.data.chat import validate_messages

DEFAULT_TASK_ROWS = 1000
"""Rows generated for `task:<name>` when neither `limit` nor `n` is given."""

FILE_FORMATS = (".jsonl", ".json", ".parquet", ".csv")

Format = Literal["messages", "prompt_completion"]


def is_generated(source: str) -> bool:
    """A source generated here with train/test splits and ``task_args``: ``task:<name>`` or ``rg:<name>``."""
    return source.startswith(("task:", "rg:"))


def load_rows(source: str, split: str = "train", limit: int | None = None, **task_args: Any) -> list[dict]:
    """Rows (dicts) of a data source, at most `limit` of them.

    `source` is one of:
      - `task:<name>`: a built-in task (lmrl.data.tasks); `task_args` are its
        parameters plus optional `seed` (default 0) and `n` (exact row count;
        default `limit` or DEFAULT_TASK_ROWS, then a test split smaller than that
        returns all its unique problems); `split` is "train" or "test" (disjoint prompts);
      - `rg:<name>` or `rg:<a>+<b>`: reasoning-gym dataset(s), `task_args` their config
        (`lmrl.data.tasks.reasoning_gym`), split and counted like built-in tasks;
      - a local `.jsonl`, `.json`, `.parquet` or `.csv` file (`split` is ignored);
      - a local dataset directory (`save_to_disk` output or data files) or an HF
        hub id, loaded with `datasets` (`split` as given; offline only the cache).
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}.")
    if source.startswith("task:"):
        return _task_rows(source[len("task:") :], split, limit, task_args)
    if source.startswith("rg:"):
        return _task_rows(source, split, limit, task_args)
    if task_args:
        raise ValueError(f"{source}: extra arguments {sorted(task_args)} only apply to built-in tasks (task:<name>).")
    problem = local_source_problem(source)
    if problem:
        raise ValueError(problem)
    path = os.path.expanduser(source)
    ext = os.path.splitext(path)[1].lower()
    if ext in FILE_FORMATS:
        try:
            rows = _read_file(path, ext, limit)
        except UnicodeDecodeError as e:
            raise ValueError(
                f"data file {source!r} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset "
                f"{e.start}). Save it as UTF-8."
            ) from None
    elif os.path.isdir(path):
        rows = _read_hf(path, split, limit, local=True)
    else:
        rows = _read_hf(source, split, limit, local=False)
    if not rows:
        raise ValueError(f"{source}: no rows found (split {split!r}). Check the file or the split name.")
    return rows[:limit] if limit is not None else rows


SOURCE_KEYS = (
    "dataset",
    "eval_dataset",
    "train_dataset",
    "ptx_dataset",
    "eval_metrics_dataset",
    "warm_start_dataset",
    "data",
)
"""Config keys that name a data source (`load_rows`): `check_sources` checks their local paths at start-up."""


def local_source_problem(source: str) -> str | None:
    """What is wrong with a local data path (missing, a folder where a file is meant, a FIFO or device), or None
    (also for built-in tasks and hub ids). Reads nothing: `lmrl.cli` asks before any heavy import."""
    if is_generated(source) or source.startswith("builtin:"):
        return None
    path = os.path.expanduser(source)
    exists, is_dir = os.path.exists(path), os.path.isdir(path)
    if exists and not is_dir and not os.path.isfile(path):
        return (
            f"data file {source!r} is not a regular file (a FIFO or a device, which a read would wait on or "
            "never finish); give a regular file, a dataset directory, a hub id, or task:<name>."
        )
    if os.path.splitext(path)[1].lower() in FILE_FORMATS and not os.path.isfile(path):
        if is_dir:
            return f"data file {source!r} is a directory; give the .jsonl/.json/.parquet/.csv file inside it."
        return (
            f"data file {source!r} not found (working directory {os.getcwd()}); give an existing "
            ".jsonl/.json/.parquet/.csv file, a dataset directory, a hub id, or task:<name>."
        )
    if not exists and source.startswith(("/", "./", "../", "~")):
        return f"dataset path {source!r} not found; give an existing file or directory, a hub id, or task:<name>."
    return None


def check_sources(config: Any) -> None:
    """The local data paths of a config (`SOURCE_KEYS`), each message naming its key: `lmrl.cli` calls it before
    importing the trainer, so a typo in a path fails in a second, once (not once per rank after torchrun)."""
    for key in (k for k in SOURCE_KEYS if hasattr(config, k)):
        source = getattr(config, key)
        problem = local_source_problem(source) if isinstance(source, str) else None
        if problem:
            raise ValueError(f"'{key}': {problem}")


def _task_rows(name: str, split: str, limit: int | None, task_args: dict) -> list[dict]:
    from lmrl.data.tasks import get_task, make_rows

    args = dict(task_args)
    seed = int(args.pop("seed", 0))
    n = args.pop("n", None)
    # `limit` is "at most": a small test split returns all its unique problems; an explicit `n` is exact.
    allow_fewer = n is None
    n = n or limit or DEFAULT_TASK_ROWS
    if name.startswith("rg:"):  # reasoning-gym: task_args configure its dataset(s)
        from lmrl.data.tasks.reasoning_gym import rg_rows

        return rg_rows(name, split, int(n), seed, args, allow_fewer)
    rows = make_rows(get_task(name, **args), int(n), split=split, seed=seed, allow_fewer=allow_fewer)
    return rows[:limit] if limit is not None else rows


def _read_file(path: str, ext: str, limit: int | None) -> list[dict]:
    name = os.path.basename(path)
    if ext == ".jsonl":
        return _read_jsonl(path, limit)
    if ext == ".json":
        with open(path, encoding="utf-8") as f:
            text = f.read()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            if e.msg == "Extra data":  # JSON Lines in a .json file
                return _read_jsonl(path, limit)
            raise ValueError(f"{name}: not valid JSON at line {e.lineno} ({e.msg}). Fix the file.") from e
        if isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
            lengths = {len(v) for v in data.values()}
            if len(lengths) != 1:
                raise ValueError(f"{name}: columns have different lengths {sorted(lengths)}.")
            keys = list(data)
            data = [dict(zip(keys, vals)) for vals in zip(*data.values())]
        if not isinstance(data, list):
            raise ValueError(
                f"{name}: expected a JSON list of row objects (or an object of equal-length "
                f"column lists), got {type(data).__name__}. Convert it, e.g. to JSON Lines."
            )
        for i, row in enumerate(data):
            if not isinstance(row, dict):
                raise ValueError(f"{name}: row {i + 1} is a {type(row).__name__}, not an object.")
        return data
    if ext == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except Exception as e:  # pyarrow raises several types for corrupt files
            raise ValueError(f"{name}: cannot read Parquet ({type(e).__name__}: {e}).") from e
    with open(path, encoding="utf-8", newline="") as f:  # .csv
        reader = csv.DictReader(f, strict=True)  # strict: an unclosed quote is an error, not a field to EOF
        rows = []
        try:
            for row in reader:
                if None in row:
                    raise ValueError(
                        f"{name}: row {len(rows) + 1} (line {reader.line_num}) has more fields than "
                        f"the header {reader.fieldnames}. Quote fields that contain commas."
                    )
                rows.append(dict(row))
                if limit is not None and len(rows) >= limit:
                    break
        except csv.Error as e:
            raise ValueError(
                f"{name}: not valid CSV at line {reader.line_num} ({e}); check for an unclosed "
                f'quote (a " inside a field is written "").'
            ) from None
        return rows


def _read_jsonl(path: str, limit: int | None) -> list[dict]:
    name = os.path.basename(path)
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{name}: line {lineno} is not valid JSON ({e.msg} at column {e.colno}): "
                    f"{line.strip()[:80]!r}. Fix or delete that line."
                ) from e
            if not isinstance(row, dict):
                raise ValueError(
                    f"{name}: line {lineno} is a JSON {type(row).__name__}, not an object with "
                    "named columns. Each line must be one row object."
                )
            rows.append(row)
            if limit is not None and len(rows) >= limit:
                break
    return rows


def _read_hf(source: str, split: str, limit: int | None, local: bool) -> list[dict]:
    import datasets

    saved = local and any(os.path.exists(os.path.join(source, f)) for f in ("dataset_dict.json", "state.json"))
    try:
        ds = datasets.load_from_disk(source) if saved else datasets.load_dataset(source, split=split)
    except Exception as e:  # network, missing repo, bad split: many exception types
        first = str(e).splitlines()[0] if str(e) else ""
        raise ValueError(
            f"could not load dataset {source!r} split {split!r} ({type(e).__name__}: {first}). "
            "Give a local .jsonl/.json/.parquet/.csv file, a local dataset directory, a hub id "
            "that is in the HF cache when offline, or task:<name>."
        ) from e
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise ValueError(f"{source}: no split {split!r}; the splits are {sorted(ds)}.")
        ds = ds[split]
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    return ds.to_list()


def detect_format(columns: Sequence[str], where: str) -> Format:
    """ "messages" if a `messages` column exists, else "prompt_completion" if `prompt` and `completion` do."""
    cols = set(columns)
    if "messages" in cols:
        return "messages"
    if {"prompt", "completion"} <= cols:
        return "prompt_completion"
    raise ValueError(
        f"{where}: found columns {sorted(cols)}, but SFT data needs either a 'messages' column "
        "(a list of {'role', 'content'} dicts) or both 'prompt' and 'completion' columns. "
        "Rename the columns (e.g. question -> prompt, answer -> completion)."
    )


def require_columns(columns: Sequence[str], needed: Sequence[str], where: str) -> None:
    """Raise a ValueError naming the columns found if any of `needed` is missing."""
    missing = [c for c in needed if c not in set(columns)]
    if missing:
        raise ValueError(
            f"{where}: missing column(s) {missing}; found columns {sorted(columns)}, need "
            f"{list(needed)}. Rename or add the columns."
        )


def row_where(index: int, where: str) -> str:
    """Human name of row `index` (0-based) of a source: "row 17 of data.jsonl" (1-based)."""
    return f"row {index + 1} of {where}"


def coerce_messages(value: Any, where: str) -> Any:
    """Messages as a list; a JSON string (as stored in CSV files) is decoded."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{where}: 'messages' is a string that is not valid JSON ({e.msg}); store a list of "
                "{'role', 'content'} dicts (JSONL/Parquet) or its JSON text (CSV)."
            ) from e
    return value


def check_completion(completion: Any, where: str) -> None:
    """Raise a ValueError naming `where` if a completion is empty or not text."""
    if isinstance(completion, list):  # conversational completion: its assistant messages
        contents = [m.get("content") for m in completion if isinstance(m, dict) and m.get("role") == "assistant"]
        if not contents:
            raise ValueError(f"{where}: completion has no assistant message. Fix or drop the row.")
        for c in contents:
            check_completion(c, where)
        return
    if not isinstance(completion, str):
        raise ValueError(f"{where}: completion must be a string, got {type(completion).__name__}. Fix or drop the row.")
    if not completion.strip():
        raise ValueError(f"{where}: empty completion; every example needs a non-empty target to learn. Drop the row.")


def check_prompt(prompt: Any, where: str) -> None:
    """Raise a ValueError naming `where` if a prompt is neither text nor a message list."""
    if isinstance(prompt, str):
        return
    if isinstance(prompt, list):
        validate_messages(prompt, where, require_assistant_last=False)
        return
    raise ValueError(
        f"{where}: prompt must be a string or a list of messages, got {type(prompt).__name__}. Fix or drop the row."
    )


def check_messages(messages: Any, where: str) -> list[dict]:
    """Decoded, validated messages of a row (role order, non-empty assistant turns)."""
    messages = coerce_messages(messages, where)
    validate_messages(messages, where)
    for j, m in enumerate(messages):
        if m["role"] == "assistant" and not m["content"].strip():
            raise ValueError(
                f"{where}: assistant message {j} is empty; every assistant turn needs text. Drop the row or the turn."
            )
    return list(messages)
