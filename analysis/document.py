"""A report as a list of sections, rendered twice: self-contained HTML and Markdown.

HTML embeds every figure as a base64 PNG and carries its CSS inline, so the file opens offline
and can be mailed around; it needs no JavaScript. Markdown writes each figure as a PNG file next
to the ``.md`` file. Every section has a stable ``id`` (HTML ``<section id=...>`` and a Markdown
anchor) that tests and links can rely on.
"""

from __future__ import annotations

import base64
import html
import math
import re
import numbers
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Image:
    """A rendered figure: PNG bytes, alt text and a caption."""

    png: bytes
    alt: str
    caption: str = ""


@dataclass(frozen=True)
class Table:
    df: pd.DataFrame
    caption: str = ""


@dataclass
class Section:
    """``id`` is the stable anchor; ``items`` are paragraphs (str), ``Table``s and ``Image``s."""

    id: str
    title: str
    items: list = field(default_factory=list)


_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto;
       max-width: 1100px; padding: 0 1rem; color: #222; line-height: 1.45; }
h1 { border-bottom: 2px solid #444; padding-bottom: .3rem; }
h2 { margin-top: 2.2rem; border-bottom: 1px solid #bbb; }
nav ul { columns: 2; }
table { border-collapse: collapse; font-size: .85rem; margin: .6rem 0; }
th, td { border: 1px solid #ccc; padding: .2rem .5rem; text-align: right; }
th { background: #f0f0f0; }
td:first-child, th:first-child { text-align: left; }
.scroll { overflow-x: auto; }
code { font-size: .9em; background: #f3f3f3; padding: 0 .2em; }
figure { margin: 1rem 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #ddd; }
figcaption, .caption { font-size: .85rem; color: #555; }
"""


def format_value(value) -> str:
    """Numbers to 4 significant digits, integers exactly, NaN/None as an empty cell."""
    if value is None or (isinstance(value, numbers.Real) and math.isnan(value)):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, numbers.Integral):
        return f"{int(value):d}"
    if isinstance(value, numbers.Real):
        value = float(value)
        return f"{int(value):d}" if value.is_integer() and abs(value) < 1e15 else f"{value:.4g}"
    return str(value)


def _formatted(df: pd.DataFrame) -> pd.DataFrame:
    return df.astype(object).map(format_value)


def _html_table(table: Table) -> str:
    body = _formatted(table.df).to_html(index=False, escape=True, border=0)
    caption = f'<p class="caption">{html.escape(table.caption)}</p>' if table.caption else ""
    return f'<div class="scroll">{body}</div>{caption}'


def _html_image(image: Image) -> str:
    data = base64.b64encode(image.png).decode("ascii")
    caption = f"<figcaption>{html.escape(image.caption)}</figcaption>" if image.caption else ""
    return (
        f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(image.alt)}">'
        f"{caption}</figure>"
    )


def _inline_code(text: str) -> str:
    """Markdown's `code` spans as <code> (the text is already escaped)."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", text)


def render_html(title: str, sections: list[Section]) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        "<nav><ul>",
        *(f'<li><a href="#{s.id}">{html.escape(s.title)}</a></li>' for s in sections),
        "</ul></nav>",
    ]
    for s in sections:
        parts.append(f'<section id="{s.id}"><h2>{html.escape(s.title)}</h2>')
        for item in s.items:
            if isinstance(item, Table):
                parts.append(_html_table(item))
            elif isinstance(item, Image):
                parts.append(_html_image(item))
            else:
                parts.append(f"<p>{_inline_code(html.escape(str(item)))}</p>")
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _md_cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(df: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table (no extra dependency)."""
    cells = _formatted(df)
    lines = [
        "| " + " | ".join(_md_cell(c) for c in df.columns) + " |",
        "|" + "|".join("---" for _ in df.columns) + "|",
    ]
    lines += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in cells.itertuples(index=False)]
    return "\n".join(lines)


def render_markdown(title: str, sections: list[Section], out_dir: Path, stem: str) -> str:
    """Markdown text; writes figures as ``<stem>_<section id>[_<k>].png`` into ``out_dir``."""
    parts = [f"# {title}", ""]
    for s in sections:
        parts += [f'<a id="{s.id}"></a>', "", f"## {s.title}", ""]
        images = [i for i in s.items if isinstance(i, Image)]
        k = 0
        for item in s.items:
            if isinstance(item, Table):
                parts += [markdown_table(item.df), ""]
                if item.caption:
                    parts += [f"*{item.caption}*", ""]
            elif isinstance(item, Image):
                suffix = f"_{k}" if len(images) > 1 else ""
                name = f"{stem}_{s.id}{suffix}.png"
                k += 1
                (out_dir / name).write_bytes(item.png)
                parts += [f"![{item.alt}]({name})", ""]
                if item.caption:
                    parts += [f"*{item.caption}*", ""]
            else:
                parts += [str(item), ""]
    return "\n".join(parts)


def write_document(out_dir: Path, stem: str, title: str, sections: list[Section]) -> tuple[Path, Path]:
    """Write ``<stem>.html`` and ``<stem>.md`` (+ PNGs) into ``out_dir``; return both paths."""
    out_dir = Path(out_dir)
    html_path, md_path = out_dir / f"{stem}.html", out_dir / f"{stem}.md"
    html_path.write_text(render_html(title, sections), encoding="utf-8")
    md_path.write_text(render_markdown(title, sections, out_dir, stem), encoding="utf-8")
    return html_path, md_path
