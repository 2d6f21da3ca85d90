"""The report page: the HTML of a :func:`~datamask.evaluation.browse.build_report` result and
its figures (matplotlib PNGs inlined as base64). Every text that enters the page is
HTML-escaped, and the page's Content-Security-Policy forbids scripts and any request."""

from __future__ import annotations

import base64
import html
import io
import json
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..io.atomic import atomic_write_text
from .histogram import Histogram
from .plots import _color, literal, literal_text, require_matplotlib

__all__ = ["REPORT_SECTIONS", "TEXT_CHARS", "render_html", "write_report"]

#: The page's sections (their HTML ids), in order.
REPORT_SECTIONS = (
    "overview",
    "topics",
    "distributions",
    "map",
    "duplicates",
    "samples",
    "covered",
    "settings",
)

#: Characters of a document's text shown on the page (whitespace collapsed).
TEXT_CHARS = 360


# --- figures ---------------------------------------------------------------------------------
def _png(fig: Any) -> str:
    plt = require_matplotlib()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=72, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


@literal_text
def _fig_distributions(hist: Histogram, labels: Sequence[str], xlabel: str) -> str:
    plt = require_matplotlib()
    cols = len(labels)
    fig, axes = plt.subplots(1, cols, figsize=(3.4 * cols, 2.4), squeeze=False, sharey=True)
    widths = np.diff(hist.edges)
    centers = (
        np.sqrt(hist.edges[:-1] * hist.edges[1:]) if hist.log else hist.edges[:-1] + widths / 2
    )

    def density(c: np.ndarray) -> np.ndarray:
        total = c.sum()
        return c / total if total else c * 0.0

    for ax, label, kept in zip(axes[0], labels, hist.kept, strict=True):
        ax.step(centers, density(hist.all), where="mid", color="black", lw=1, label="all")
        ax.fill_between(
            centers, density(kept), step="mid", color=_color(label), alpha=0.5, label="kept"
        )
        ax.step(
            centers,
            density(hist.all - kept),
            where="mid",
            color="tab:blue",
            lw=1,
            ls="--",
            label="dropped",
        )
        if hist.log:
            ax.set_xscale("log")
        ax.set_title(literal(label), fontsize=9)
        ax.set_xlabel(literal(xlabel), fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("share of documents", fontsize=8)
    axes[0][0].legend(fontsize=7, frameon=False)
    return _png(fig)


@literal_text
def _fig_map(data: dict[str, Any], labels: Sequence[str], n_topics: int, method: str) -> str:
    plt = require_matplotlib()
    xy, topic, kept = data["xy"], data["topic"], data["kept"]
    cols = len(labels) + 1
    fig, axes = plt.subplots(1, cols, figsize=(3.0 * cols, 3.0), squeeze=False)
    cmap = plt.get_cmap("tab20")
    ax = axes[0][0]
    ax.scatter(xy[:, 0], xy[:, 1], s=3, c=topic % 20, cmap=cmap, vmin=0, vmax=19, linewidths=0)
    for t in range(n_topics):
        pts = xy[topic == t]
        if len(pts):
            mx, my = np.median(pts, axis=0)
            ax.text(mx, my, str(t), fontsize=8, weight="bold", ha="center", va="center")
    ax.set_title("topics", fontsize=9)
    for s, label in enumerate(labels):
        ax = axes[0][s + 1]
        ax.scatter(xy[:, 0], xy[:, 1], s=3, c="#dddddd", linewidths=0)
        mk = kept[:, s]
        ax.scatter(xy[mk, 0], xy[mk, 1], s=5, c=_color(label), linewidths=0)
        ax.set_title(f"{literal(label)}: {int(mk.sum())} of {len(mk)} kept", fontsize=9)
    for a in axes[0]:
        a.set_xticks([])
        a.set_yticks([])
    fig.suptitle(f"{method.upper()} map of a seeded sample", fontsize=9, y=1.06)
    return _png(fig)


@literal_text
def _fig_topic_shares(report: dict[str, Any]) -> str:
    plt = require_matplotlib()
    topics = report["topics"]
    sels = report["selections"]
    t = np.arange(len(topics))
    width = 0.8 / len(sels)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.55 * len(topics) * max(1, len(sels)) / 1.5), 2.6))
    for s, sel in enumerate(sels):
        share = [p["share"] or 0.0 for p in sel["topics"]]
        ax.bar(
            t + (s - (len(sels) - 1) / 2) * width,
            share,
            width,
            color=_color(sel["label"]),
            label=literal(sel["label"]),
        )
    overall = np.mean([sel["share"] for sel in sels])
    ax.axhline(overall, color="black", lw=0.8, ls=":", label="overall share")
    ax.set_xticks(t)
    ax.set_xticklabels([str(i) for i in t], fontsize=8)
    ax.set_xlabel("topic", fontsize=8)
    ax.set_ylabel("share kept", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, frameon=False, ncol=len(sels) + 1)
    return _png(fig)


# --- the page --------------------------------------------------------------------------------
_PAGE = string.Template(
    """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; \
style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>$title</title>
<style>
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:0 auto;max-width:1280px;
padding:0 20px 40px;color:#222}
h1{font-size:22px;margin:18px 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid
#ddd;padding-bottom:3px}h3{font-size:15px;margin:14px 0 6px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}th,td{padding:3px 8px;border:1px solid
#e3e3e3;text-align:right;vertical-align:top}th{background:#f6f6f6}td.l,th.l{text-align:left}
.muted{color:#777}.bad{background:#fdecea}.doc{font-size:12px;white-space:pre-wrap;
background:#fafafa;border:1px solid #eee;padding:5px;margin:3px 0;overflow-wrap:anywhere}
.grid{display:grid;grid-template-columns:repeat($ncols,minmax(0,1fr));gap:10px}
.pair{display:grid;grid-template-columns:1fr 1fr;gap:6px}
img{max-width:100%}details{margin:4px 0}summary{cursor:pointer}
nav a{margin-right:12px}pre{font-size:12px;background:#fafafa;padding:6px;overflow:auto}
</style></head><body>
<h1>$title</h1>
<p class="muted">$subtitle</p>
<nav>$nav</nav>
$body
</body></html>
"""
)


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _f(value: float | None, fmt: str = ".3f") -> str:
    return "&ndash;" if value is None else format(value, fmt)


def _section(sid: str, title: str, inner: str) -> str:
    return f'<section id="{sid}"><h2>{_e(title)}</h2>\n{inner}\n</section>'


def _img(b64: str, alt: str) -> str:
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{b64}">'


def render_html(report: dict[str, Any]) -> str:
    """The page of a :func:`build_report` result: one string, no external resource; one
    section per entry of ``REPORT_SECTIONS``, each made by its own function."""
    sels = report["selections"]
    labels = [s["label"] for s in sels]
    sections = {
        "overview": ("Overview", _overview_html(report)),
        "topics": ("Topics", _topics_html(report)),
        "distributions": ("Quality and length", _distributions_html(report)),
        "map": ("Map", _map_html(report)),
        "duplicates": ("Near-duplicates", _duplicates_html(report)),
        "samples": ("Text samples", _samples_html(report)),
        "covered": ("Dropped and what covers them", _covered_html(report)),
        "settings": ("Settings", _settings_html(report)),
    }
    nav = "".join(f'<a href="#{sid}">{_e(sections[sid][0])}</a>' for sid in REPORT_SECTIONS)
    body = "\n".join(_section(sid, *sections[sid]) for sid in REPORT_SECTIONS)
    return _PAGE.substitute(
        title=_e(f"datamask report: {', '.join(labels)}"),
        subtitle=_e(f"{report['source']}: {report['n_docs']:,} documents; seed {report['seed']}"),
        nav=nav,
        body=body,
        ncols=len(sels),
    )


def _tokens_cell(sel: dict[str, Any], report: dict[str, Any]) -> str:
    """A selection's kept tokens: the length column's sum over its kept documents against
    the corpus', and the token budget its summary records (with the kept tokens it
    records where they were counted in another column)."""
    parts = []
    kept, total = sel["tokens_kept"], report["tokens_all"]
    if kept is not None:
        share = f" ({100 * kept / total:.1f}%)" if total else ""
        parts.append(f"{kept:,.0f} of {total:,.0f}{share}")
    rec = sel["tokens"]
    if rec:
        text = f"budget {rec['budget']:,.0f}"
        if kept is None or rec.get("length_col") != report["length_col"]:
            text += f" ({_e(rec.get('length_col'))}: {rec['kept']:,.0f} kept)"
        parts.append(f'<span class="muted">{text}</span>')
    return "<br>".join(parts) or "-"


def _overview_html(report: dict[str, Any]) -> str:
    """The overview table: per selection its file, share kept, quality and length kept
    and dropped, and its recorded terms."""
    sels = report["selections"]
    labels = [s["label"] for s in sels]
    n = report["n_docs"]
    ql = report["quality_label"]
    head = "".join(f"<th>{_e(lab)}</th>" for lab in labels)
    rows = [
        ("file", [f'<span class="muted">{_e(s["path"])}</span>' for s in sels]),
        ("documents kept", [f"{s['k']:,} of {n:,} ({100 * s['share']:.1f}%)" for s in sels]),
        (f"mean {ql} kept", [_f(s["quality_kept"]) for s in sels]),
        (f"mean {ql} dropped", [_f(s["quality_dropped"]) for s in sels]),
    ]
    if report["length_all"] is not None:
        rows += [
            (f"mean {report['length_label']} kept", [_f(s["length_kept"], ",.0f") for s in sels]),
            (
                f"mean {report['length_label']} dropped",
                [_f(s["length_dropped"], ",.0f") for s in sels],
            ),
        ]
    if any(s["tokens_kept"] is not None or s["tokens"] for s in sels):
        label = "tokens kept" + (
            f" ({report['length_label']})" if report["length_all"] is not None else ""
        )
        rows.append((label, [_tokens_cell(s, report) for s in sels]))
    term_names = list(dict.fromkeys(k for s in sels for k in (s["terms"] or {})))
    for name in term_names:
        label = "objective J" if name == "J" else f"term {name}"
        rows.append((label, [_f((s["terms"] or {}).get(name), ".4f") for s in sels]))
    body_rows = "".join(
        f'<tr><th class="l">{_e(name)}</th>' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"
        for name, cells in rows
    )
    corpus_line = (
        f"<p>{n:,} documents; mean {_e(ql)} {_f(report['quality_all'])}"
        + (
            f", mean {_e(report['length_label'])} {_f(report['length_all'], ',.0f')}"
            if report["length_all"] is not None
            else ""
        )
        + ".</p>"
    )
    overview = (
        corpus_line
        + f'<table><tr><th class="l">selection</th>{head}</tr>{body_rows}</table>'
        + '<p class="muted">Terms are those the selection\'s summary recorded (none for a '
        "plain list of ids).</p>"
    )
    return overview


def _topics_html(report: dict[str, Any]) -> str:
    """Per topic its words, documents, and per selection what was kept and its quality."""
    sels = report["selections"]
    labels = [s["label"] for s in sels]
    ql = report["quality_label"]
    n_topics = len(report["topics"])
    th = (
        '<tr><th rowspan="2">topic</th><th class="l" rowspan="2">most frequent words</th>'
        '<th rowspan="2">docs</th>'
        + "".join(f'<th colspan="4">{_e(lab)}</th>' for lab in labels)
        + "</tr><tr>"
        + "<th>kept</th><th>share</th><th>q kept</th><th>q dropped</th>" * len(sels)
        + "</tr>"
    )
    trs = []
    for t, topic in enumerate(report["topics"]):
        cells = [
            f"<td>{t}</td>",
            f'<td class="l">{_e(", ".join(topic["words"])) or "&ndash;"}</td>',
            f"<td>{topic['n']:,}</td>",
        ]
        for s in sels:
            p = s["topics"][t]
            low = p["share"] is not None and p["share"] < 0.25 * s["share"]
            cls = ' class="bad"' if low else ""
            cells += [
                f"<td>{p['kept']:,}</td>",
                f"<td{cls}>{_f(p['share'] and 100 * p['share'], '.1f')}%</td>",
                f"<td>{_f(p['q_kept'])}</td>",
                f"<td>{_f(p['q_dropped'])}</td>",
            ]
        trs.append("<tr>" + "".join(cells) + "</tr>")
    topics_html = (
        f"<p>{n_topics} topics: spherical k-means of the embeddings, fitted on the seeded "
        f"sample of {report['sample_size']:,} documents, every document assigned to its "
        f"nearest centroid. q is the mean {_e(ql)}. A share below a quarter of the "
        "selection's overall share is shaded.</p>"
        + _img(_fig_topic_shares(report), "share kept per topic")
        + f"<table>{th}{''.join(trs)}</table>"
    )
    return topics_html


def _distributions_html(report: dict[str, Any]) -> str:
    """The quality and length histograms of the corpus, the kept and the dropped."""
    sels = report["selections"]
    labels = [s["label"] for s in sels]
    ql = report["quality_label"]
    dist = (
        "<h3>"
        + _e(ql)
        + "</h3>"
        + _img(_fig_distributions(report["_quality_hist"], labels, ql), f"{ql} distribution")
    )
    if report["_length_hist"] is not None:
        ll = report["length_label"]
        dist += (
            "<h3>"
            + _e(ll)
            + "</h3>"
            + _img(_fig_distributions(report["_length_hist"], labels, ll), f"{ll} distribution")
        )
    dist = (
        "<p>Share of documents per bin over the whole corpus (black), the kept (filled) and "
        "the dropped (dashed).</p>" + dist
    )
    return dist


def _map_html(report: dict[str, Any]) -> str:
    """The 2-D map of the seeded sample."""
    sels = report["selections"]
    labels = [s["label"] for s in sels]
    n_topics = len(report["topics"])
    map_html = _img(
        _fig_map(report["_map"], labels, n_topics, report["map_method"]), "map of a sample"
    ) + (
        f'<p class="muted">{len(report["_map"]["xy"]):,} documents of the seeded sample '
        f"(seed {report['seed']}); left: coloured by topic (numbers as in the table); then "
        "each selection's kept documents in colour.</p>"
    )
    return map_html


def _duplicates_html(report: dict[str, Any]) -> str:
    """The near-duplicate figures of each kept set and the corpus sample, and each
    selection's closest kept pairs."""
    sels = report["selections"]
    labels = [s["label"] for s in sels]
    ts = report["thresholds"]
    th = (
        '<tr><th class="l">figure</th>'
        + "".join(f"<th>{_e(lab)}</th>" for lab in labels)
        + f"<th>corpus sample ({report['dup_sample']['n']:,})</th></tr>"
    )
    trs = []
    for t in ts:
        for key, name in (
            ("pairs", "pairs"),
            ("documents", "docs in pairs"),
            ("largest_group", "largest group"),
        ):
            cells = [f"<td>{s['duplicates']['thresholds'][t][key]:,}</td>" for s in sels]
            cells.append(f"<td>{report['dup_sample']['thresholds'][t][key]:,}</td>")
            trs.append(f'<tr><th class="l">{name} cos &gt; {_e(t)}</th>{"".join(cells)}</tr>')
    ex = []
    for s in sels:
        items = (
            "".join(
                f'<h3>cosine {e["cosine"]:.4f}</h3><div class="doc">{_e(e["a"])}</div>'
                f'<div class="doc">{_e(e["b"])}</div>'
                for e in s["examples"]
            )
            or f'<p class="muted">no kept pair above cosine {_e(ts[0])}.</p>'
        )
        ex.append(f"<div><h3>{_e(s['label'])}: closest kept pairs</h3>{items}</div>")
    dup_html = (
        "<p>The figures of <code>datamask evaluate</code>, exact over each selection's kept "
        "documents; the last column measures the seeded corpus sample for scale.</p>"
        f"<table>{th}{''.join(trs)}</table>" + f'<div class="grid">{"".join(ex)}</div>'
    )
    return dup_html


def _samples_html(report: dict[str, Any]) -> str:
    """Text samples kept and dropped, per topic and selection."""
    sels = report["selections"]
    if report["text_col"] is None:
        samples_html = '<p class="muted">The input has no text column.</p>'
    else:
        parts = []
        for t, topic in enumerate(report["topics"]):
            cols = []
            for s in sels:
                sm = s["samples"][t]
                kept = "".join(f'<div class="doc">{_e(x)}</div>' for x in sm["kept"]) or (
                    '<p class="muted">none kept in the sample</p>'
                )
                drop = "".join(f'<div class="doc">{_e(x)}</div>' for x in sm["dropped"]) or (
                    '<p class="muted">none dropped in the sample</p>'
                )
                cols.append(
                    f"<div><h3>{_e(s['label'])} kept</h3>{kept}"
                    f"<h3>{_e(s['label'])} dropped</h3>{drop}</div>"
                )
            words = ", ".join(topic["words"])
            parts.append(
                f"<details{' open' if t == 0 else ''}><summary>topic {t}: {_e(words)} "
                f'({topic["n"]:,} documents)</summary><div class="grid">{"".join(cols)}'
                "</div></details>"
            )
        samples_html = (
            f"<p>Documents of the seeded sample, truncated to {TEXT_CHARS} characters.</p>"
            + "".join(parts)
        )
    return samples_html


def _covered_html(report: dict[str, Any]) -> str:
    """Dropped documents beside the kept document that covers them."""
    sels = report["selections"]
    if report["text_col"] is None:
        covered_html = '<p class="muted">The input has no text column.</p>'
    else:
        cols = []
        for s in sels:
            if s["covers"] is None:
                cols.append(
                    f'<div><h3>{_e(s["label"])}</h3><p class="muted">This selection names '
                    "no covering documents (an id list, or made before covered_by).</p></div>"
                )
                continue
            items = (
                "".join(
                    f"<h3>cosine {c['cosine']:.4f}</h3>"
                    f'<div class="pair"><div class="doc">dropped: {_e(c["dropped"])}</div>'
                    f'<div class="doc">kept: {_e(c["kept"])}</div></div>'
                    for c in s["covers"]
                )
                or '<p class="muted">nothing dropped.</p>'
            )
            cols.append(f"<div><h3>{_e(s['label'])}</h3>{items}</div>")
        covered_html = (
            "<p>Each dropped document beside the kept document nearest to it "
            "(<code>covered_by</code>, by cosine): the most similar pairs first, then the "
            "least similar ones.</p>" + f'<div class="grid">{"".join(cols)}</div>'
        )
    return covered_html


def _settings_html(report: dict[str, Any]) -> str:
    """Each selection's recorded settings."""
    sels = report["selections"]
    parts = []
    for s in sels:
        settings = s["settings"]
        text = json.dumps(settings, indent=1, sort_keys=True) if settings else "no summary"
        parts.append(
            f"<details><summary>{_e(s['label'])}: {_e(s['path'])}</summary>"
            f"<pre>{_e(text)}</pre></details>"
        )
    settings_html = "".join(parts)
    return settings_html


def write_report(report: dict[str, Any], output: str | Path) -> Path:
    """Write the page to ``output/index.html`` (atomically) and return its path."""
    path = Path(output) / "index.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(render_html(report), path)
    return path
