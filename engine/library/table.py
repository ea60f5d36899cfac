"""The library as a text table (``lookahead-chat --list-models``)."""

from __future__ import annotations

from engine.library.names import lookahead_cell
from engine.library.walk import LibraryModel
from engine.units import format_params, plain_size

TABLE_COLUMNS = (
    "path", "name", "architecture", "parameters", "quantization", "size", "context", "template", "lookahead",
    "found in",
)


def table_row(model: LibraryModel) -> tuple[str, ...]:
    """One model as the cells of ``lookahead-chat --list-models``'s table."""
    if not model.ok:
        return (model.path, model.name, "", "", "", plain_size(model.size_bytes), "", "", "no", model.source)
    return (
        model.path, model.name, model.architecture, format_params(model.n_params), model.file_type,
        plain_size(model.size_bytes), f"{model.context_length:,}" if model.context_length else "",
        "yes" if model.has_chat_template else "no",
        lookahead_cell(model.lookahead_kind), model.source,
    )


def format_table(models: list[LibraryModel]) -> str:
    """An aligned text table with a header line; broken files say why on the line below theirs."""
    rows = [tuple(c.upper() for c in TABLE_COLUMNS)] + [table_row(m) for m in models]
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_COLUMNS))]
    lines = []
    for row, model in zip(rows, [None, *models], strict=True):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if model is not None and model.error:
            lines.append(f"    ! {model.error}")
    return "\n".join(lines)
