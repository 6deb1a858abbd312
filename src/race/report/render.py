"""Render report sections to one self-contained HTML page and to Markdown.

HTML: inline CSS, figures as ``data:image/png;base64`` URIs, system fonts, no external
resource of any kind; one small inline script marks each image ``data-loaded="yes"``
once decoded (``naturalWidth > 0``) so headless checks can tell the figures rendered.
Markdown: the same blocks, figures referenced as PNG files written beside it.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Mapping, Sequence

from .doc import Callout, Figure, KeyValues, Note, Section, Table, Text

CSS = """
:root { --ink:#1f2328; --muted:#59636e; --line:#d1d9e0; --bg:#f6f8fa; --accent:#0969da; }
* { box-sizing: border-box; }
body { margin:0; background:#fff; color:var(--ink);
  font:15px/1.5 -apple-system, "Segoe UI", "Helvetica Neue", Arial, "Liberation Sans", sans-serif; }
main { max-width: 1120px; margin: 0 auto; padding: 24px 28px 64px; }
header.top { border-bottom: 3px solid var(--ink); margin-bottom: 8px; padding-bottom: 8px; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 20px; margin: 36px 0 10px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
.sub { color: var(--muted); font-size: 13px; }
nav.toc { font-size: 13px; margin: 10px 0 18px; line-height: 1.9; }
nav.toc a { color: var(--accent); text-decoration: none; margin-right: 14px; white-space: nowrap; }
td.mono { white-space: nowrap; }
code, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, "Liberation Mono", monospace;
  font-size: 12.5px; }
code { background: var(--bg); padding: 1px 4px; border-radius: 4px; }
.tablewrap { overflow-x: auto; margin: 10px 0 16px; }
table { border-collapse: collapse; font-size: 13px; min-width: 40%; }
caption { text-align: left; font-weight: 600; padding: 4px 0; color: var(--muted); }
th, td { border: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: var(--bg); font-weight: 600; }
tr:nth-child(even) td { background: #fbfcfd; }
table.kv th { width: 210px; }
figure { margin: 12px 0 20px; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 6px; }
figcaption { color: var(--muted); font-size: 13px; margin-top: 4px; }
.note { border-left: 4px solid var(--accent); background: #ddf4ff; padding: 6px 12px; margin: 8px 0;
  border-radius: 0 6px 6px 0; font-size: 14px; }
.note.warn { border-color: #bf8700; background: #fff8c5; }
.missing { border: 1px dashed #8c959f; background: var(--bg); color: var(--muted); padding: 10px 14px;
  border-radius: 6px; margin: 8px 0; }
.callout { border: 2px solid var(--line); border-radius: 8px; padding: 12px 16px; margin: 10px 0 16px; }
.callout h3 { margin: 0 0 6px; font-size: 16px; }
.callout p { margin: 4px 0; }
.callout.good { border-color: #1a7f37; } .callout.caution { border-color: #bf8700; }
.callout.bad { border-color: #cf222e; }
.label { display: inline-block; padding: 1px 10px; border-radius: 12px; font-size: 13px; font-weight: 600;
  margin-left: 8px; color: #fff; background: #59636e; vertical-align: middle; }
.label.good { background: #1a7f37; } .label.caution { background: #9a6700; } .label.bad { background: #cf222e; }
footer { margin-top: 40px; color: var(--muted); font-size: 12px; border-top: 1px solid var(--line); padding-top: 8px; }
"""

SCRIPT = ("window.addEventListener('load',function(){var n=0;document.querySelectorAll('img').forEach("
          "function(i){var ok=i.complete&&i.naturalWidth>0;i.setAttribute('data-loaded',ok?'yes':'no');"
          "if(ok)n++;});document.body.setAttribute('data-images-loaded',String(n));});")

_CODE = re.compile(r"`([^`]+)`")


def _h(text: str) -> str:
    """Escape text; `backticks` become <code>."""
    return _CODE.sub(lambda m: f"<code>{m.group(1)}</code>", html.escape(str(text)))


def _is_key(cell: str) -> bool:
    return cell.count("|") >= 4 and " " not in cell.strip()


def _html_table(t: Table) -> str:
    head = "".join(f"<th>{_h(h)}</th>" for h in t.header)
    body = []
    for row in t.rows:
        cells = "".join(f"<td class=\"mono\">{_h(c)}</td>" if _is_key(c) else f"<td>{_h(c)}</td>" for c in row)
        body.append(f"<tr>{cells}</tr>")
    cap = f"<caption>{_h(t.caption)}</caption>" if t.caption else ""
    return f"<div class=\"tablewrap\"><table>{cap}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"


def _html_block(b: object) -> str:
    if isinstance(b, Text):
        return f"<p>{'<strong>' if b.strong else ''}{_h(b.text)}{'</strong>' if b.strong else ''}</p>"
    if isinstance(b, KeyValues):
        mono = ' class="mono"'
        rows = "".join(f"<tr><th>{_h(k)}</th><td{mono if _is_key(v) else ''}>{_h(v)}</td></tr>" for k, v in b.rows)
        return f"<div class=\"tablewrap\"><table class=\"kv\"><tbody>{rows}</tbody></table></div>"
    if isinstance(b, Table):
        return _html_table(b)
    if isinstance(b, Figure):
        data = base64.b64encode(b.png).decode("ascii")
        return (f"<figure id=\"fig-{_h(b.key)}\"><img alt=\"{_h(b.caption)}\" data-figure=\"{_h(b.key)}\" "
                f"src=\"data:image/png;base64,{data}\"><figcaption>{_h(b.caption)}</figcaption></figure>")
    if isinstance(b, Note):
        return f"<div class=\"note {'warn' if b.level == 'warn' else 'info'}\">{_h(b.text)}</div>"
    if isinstance(b, Callout):
        label = f"<span class=\"label {b.tone}\">{_h(b.label)}</span>" if b.label else ""
        lines = "".join(f"<p>{_h(line)}</p>" for line in b.lines)
        return f"<div class=\"callout {b.tone}\"><h3>{_h(b.title)}{label}</h3>{lines}</div>"
    raise TypeError(f"unknown block {type(b).__name__}")


def render_html(title: str, subtitle: str, sections: Sequence[Section], footer: str = "") -> str:
    """The whole report as one HTML document (no external resources)."""
    toc = " ".join(f"<a href=\"#{s.key}\">{_h(s.title)}</a>" for s in sections)
    parts = []
    for s in sections:
        body = [_html_block(b) for b in s.blocks]
        if s.missing:
            body.append(f"<div class=\"missing\" data-missing=\"{_h(s.key)}\">Not shown: {_h(s.missing)}</div>")
        parts.append(f"<section id=\"{_h(s.key)}\"><h2>{_h(s.title)}</h2>{''.join(body)}</section>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{_h(title)}</title><style>{CSS}</style></head><body><main>"
            f"<header class=\"top\"><h1>{_h(title)}</h1><div class=\"sub\">{_h(subtitle)}</div></header>"
            f"<nav class=\"toc\">{toc}</nav>{''.join(parts)}<footer>{_h(footer)}</footer></main>"
            f"<script>{SCRIPT}</script></body></html>\n")


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_block(b: object, figure_paths: Mapping[str, str]) -> str:
    if isinstance(b, Text):
        return f"**{b.text}**" if b.strong else b.text
    if isinstance(b, KeyValues):
        return "\n".join(["| | |", "|---|---|"] + [f"| {_md(k)} | {_md(v)} |" for k, v in b.rows])
    if isinstance(b, Table):
        lines = [f"*{b.caption}*", ""] if b.caption else []
        lines += ["| " + " | ".join(_md(h) for h in b.header) + " |", "|" + "---|" * len(b.header)]
        lines += ["| " + " | ".join(_md(c) for c in row) + " |" for row in b.rows]
        return "\n".join(lines)
    if isinstance(b, Figure):
        return f"![{b.caption}]({figure_paths.get(b.key, b.key + '.png')})"
    if isinstance(b, Note):
        return f"> **{'Warning' if b.level == 'warn' else 'Note'}:** {b.text}"
    if isinstance(b, Callout):
        head = f"> **{b.title}**" + (f" — **{b.label}**" if b.label else "")
        return "\n".join([head, ">"] + [f"> {line}  " for line in b.lines])
    raise TypeError(f"unknown block {type(b).__name__}")


def render_markdown(title: str, subtitle: str, sections: Sequence[Section], figure_paths: Mapping[str, str],
                    footer: str = "") -> str:
    """The report as Markdown; ``figure_paths`` maps figure keys to relative PNG paths."""
    out = [f"# {title}", "", subtitle, ""]
    out += ["Contents: " + " · ".join(f"[{s.title}](#{s.key})" for s in sections), ""]
    for s in sections:
        out += [f"<a id=\"{s.key}\"></a>", f"## {s.title}", ""]
        for b in s.blocks:
            out += [_md_block(b, figure_paths), ""]
        if s.missing:
            out += [f"> **Not shown:** {s.missing}", ""]
    if footer:
        out += ["---", footer, ""]
    return "\n".join(out)


__all__ = ["render_html", "render_markdown", "CSS", "SCRIPT"]
