"""Text forms shared by every floor: an error's first line, a name quoted for Spark's parser. Pure, no imports,
so ``apply.sparkenv`` (read at DAG parse time) and the row filter's deparser share them without importing pglast."""

from __future__ import annotations


def first_line(text: str, default: str) -> str:
    """The first line of ``text`` (libpq's and Arrow's messages go on with hints and detail lines), so the error
    raised is one line; ``default`` when it is empty."""
    return text.strip().splitlines()[0] if text.strip() else default


def backquoted(name: str) -> str:
    """``name`` as Spark's SQL parser reads it back as one identifier: backticked, backticks doubled."""
    return "`" + name.replace("`", "``") + "`"
