"""Reading a dataset file's shape without the ``datasets`` library: where a path points,
which format it is, whether its rows hold the configured columns. The config validates
with it (no run is queued for a file that cannot work) and the engine's loader runs the
same checks before ``datasets`` reads the data, so both say the same thing.

    path = resolve("data/gsm8k_sample/train.jsonl")     # cwd first, then the checkout
    fmt = data_format(path, "task.path")                 # "json" | "parquet" | "disk"
    probe("task.path", raw, {"task.prompt_key": "question", ...}, max_rows=1000)

Every problem is a DataFileError whose message starts ``<field>=<value>`` and ends with
the fix. Pure standard library, plus pyarrow imported inside ``probe`` for Parquet.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[2]
FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
FORMS = ("a .jsonl, .json or .parquet file or a directory written by "
         "datasets.Dataset.save_to_disk")
CONFIG_PROBE_ROWS = 10_000   # rows a config check reads; the engine's load reads them all


class DataFileError(ValueError):
    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


def resolve(raw: str) -> Path:
    """An absolute path as given; a relative one from the working directory, else from
    the rlplane checkout (where the shipped sample lives), else as given (missing)."""
    p = Path(raw).expanduser()
    if p.is_absolute() or p.exists():
        return p
    return PROJECT / p if (PROJECT / p).exists() else p


def data_format(field: str, raw: str) -> tuple[Path, str]:
    path = resolve(raw)
    if not path.exists():
        raise DataFileError(field, f"{field}={raw!r}: no such file or directory (looked in "
                                   f"{Path.cwd()} and {PROJECT}); point it at {FORMS}")
    if path.is_dir():
        if (path / "dataset_dict.json").exists():
            splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
            first = splits[0] if splits else "train"
            raise DataFileError(field, f"{field}={raw!r} holds a DatasetDict (splits "
                                       f"{', '.join(splits)}); point {field} at one split's "
                                       f"directory, e.g. {raw.rstrip('/')}/{first}")
        if not (path / "state.json").exists():
            raise DataFileError(field, f"{field}={raw!r} is a directory without state.json, "
                                       f"not one written by save_to_disk; point it at {FORMS}")
        return path, "disk"
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise DataFileError(field, f"{field}={raw!r} has suffix {path.suffix!r}; convert it "
                                   f"to JSON Lines or Parquet, or point it at {FORMS}")
    try:
        with path.open("rb") as fh:
            fh.read(1)
    except OSError as exc:
        raise DataFileError(field, f"{field}={raw!r} cannot be read ({exc.strerror or exc}); "
                                   f"check the file's permissions") from None
    return path, fmt


def lookup(row: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    """(found, value) of a dotted key: ``reward_model.ground_truth`` reads a nested column."""
    node: Any = row
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def columns(row: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Every dotted key of a row, nested ones included."""
    out = []
    for k, v in row.items():
        out.append(prefix + k)
        if isinstance(v, Mapping):
            out += columns(v, f"{prefix}{k}.")
    return out


def is_messages(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, Mapping) and isinstance(m.get("role"), str)
        and isinstance(m.get("content"), str) for m in value)


def check_row(field: str, raw: str, where: str, row: Any, keys: Mapping[str, str]) -> None:
    """``keys`` maps each key field (``task.prompt_key``) to its dotted column; the prompt
    must be text or chat messages, every other column present and not null."""
    if not isinstance(row, Mapping):
        raise DataFileError(field, f"{field}={raw!r} {where} is a {type(row).__name__}, not "
                                   f"a JSON object; every row must be an object of columns")
    for key_field, key in keys.items():
        found, value = lookup(row, key)
        if not found:
            have = ", ".join(columns(row)) or "no columns"
            raise DataFileError(key_field, f"{key_field}={key!r} is not a column of {raw!r} "
                                           f"({where} has {have}); set {key_field} to one of "
                                           f"them (dotted for nested columns)")
        if key_field == "task.prompt_key":
            if not (isinstance(value, str) or is_messages(value)):
                raise DataFileError(key_field, f"{key_field}={key!r}: {where} of {raw!r} holds "
                                               f"a {type(value).__name__}, not text or a list "
                                               f"of chat messages ({{role, content}}); fix the "
                                               f"data or choose another column")
        elif value is None:
            raise DataFileError(key_field, f"{key_field}={key!r}: {where} of {raw!r} is null; "
                                           f"fill it in or drop that row")


def json_rows(field: str, raw: str, path: Path) -> Iterator[tuple[str, Any]]:
    """(where, row) of a JSON Lines file, or of a .json file holding one array of rows."""
    with path.open(encoding="utf-8", errors="strict") as fh:
        try:
            head = fh.read(4096).lstrip()
        except UnicodeDecodeError as exc:
            raise DataFileError(field, f"{field}={raw!r} is not UTF-8 text ({exc.reason}); "
                                       f"re-encode it as UTF-8") from None
    if head.startswith("["):
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise DataFileError(field, f"{field}={raw!r} is not valid JSON ({exc}); fix the "
                                       f"file or write it as JSON Lines") from None
        for i, row in enumerate(rows, 1):
            yield f"row {i}", row
        return
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise DataFileError(field, f"{field}={raw!r} line {n} is not valid JSON ({exc}); "
                                           f"fix or delete that line") from None
            yield f"line {n}", row


def probe(field: str, raw: str, keys: Mapping[str, str], max_rows: int | None) -> int:
    """Check the file at ``raw`` and its first ``max_rows`` rows (all when None); returns
    the rows checked. Raises DataFileError naming the field and the fix."""
    path, fmt = data_format(field, raw)
    if fmt == "json":
        n = 0
        try:
            for where, row in json_rows(field, raw, path):
                check_row(field, raw, where, row, keys)
                n += 1
                if max_rows is not None and n >= max_rows:
                    break
        except UnicodeDecodeError as exc:
            raise DataFileError(field, f"{field}={raw!r} is not UTF-8 text ({exc.reason}); "
                                       f"re-encode it as UTF-8") from None
    elif fmt == "parquet":
        n = _probe_parquet(field, raw, path, keys)
    else:
        n = _probe_saved(field, raw, path, keys)
    if n == 0:
        raise DataFileError(field, f"{field}={raw!r} holds no rows; point it at data with at "
                                   f"least one example")
    return n


def _schema_row(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A stand-in row (column -> placeholder) for checking keys against a schema."""
    return {k: _schema_row(v) if isinstance(v, Mapping) else v for k, v in fields.items()}


def _probe_parquet(field: str, raw: str, path: Path, keys: Mapping[str, str]) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataFileError(field, f"{field}={raw!r} cannot be read as Parquet ({exc}); "
                                   f"rewrite it (e.g. Dataset.to_parquet)") from None

    def shape(t: pa.DataType) -> Any:
        if pa.types.is_struct(t):
            return {t.field(i).name: shape(t.field(i).type) for i in range(t.num_fields)}
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return "text"
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            inner = t.value_type
            if pa.types.is_struct(inner) and {"role", "content"} <= {
                    inner.field(i).name for i in range(inner.num_fields)}:
                return [{"role": "user", "content": "text"}]
            return []
        return 0

    schema = meta.schema_arrow
    row = {f.name: shape(f.type) for f in schema}
    check_row(field, raw, "its schema", row, keys)
    return meta.metadata.num_rows


def _probe_saved(field: str, raw: str, path: Path, keys: Mapping[str, str]) -> int:
    try:
        info = json.loads((path / "dataset_info.json").read_text())
        state = json.loads((path / "state.json").read_text())
    except (OSError, ValueError) as exc:
        raise DataFileError(field, f"{field}={raw!r}: dataset_info.json or state.json cannot "
                                   f"be read ({exc}); save the dataset again") from None

    def shape(f: Any) -> Any:
        if isinstance(f, Mapping) and "_type" not in f:
            return {k: shape(v) for k, v in f.items()}
        if isinstance(f, Mapping) and f.get("_type") == "Value":
            return "text" if f.get("dtype") in ("string", "large_string") else 0
        if isinstance(f, Mapping) and f.get("_type") in ("List", "LargeList", "Sequence"):
            inner = f.get("feature")
            if isinstance(inner, Mapping) and {"role", "content"} <= set(inner):
                return [{"role": "user", "content": "text"}]
            return []
        return 0

    row = {k: shape(v) for k, v in (info.get("features") or {}).items()}
    check_row(field, raw, "its features", row, keys)
    # No data file: no rows. Counting rows means reading the arrow files; the engine's
    # load checks that.
    return len(state.get("_data_files", []))
