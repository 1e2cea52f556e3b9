"""``problems.html``: the problem browser beside index.html, one self-contained page as it is (no
network, the style inline, one script of its own, :data:`~mlmt_bench.report.page_script.BROWSER_JS`,
the only one its Content-Security-Policy lets run).

One card per problem of the final evaluation (:mod:`mlmt_bench.report.problem_set`): the problem,
its gold answer, and per arm each seed's transition (attempt → final answer) and one logged
episode (attempt, feedback, refinement, with their verdicts). The script filters the cards by arm
and by transition and shows 25 at a time; without it every card shows. Every text from a run is
escaped (:func:`mlmt_bench.report.html.esc`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlmt_bench.report import page_script
from mlmt_bench.report.escape import esc
from mlmt_bench.report.html import DASH, PAGE_CSS
from mlmt_bench.report.problem_set import TRANSITIONS, ProblemRow, problem_rows
from mlmt_bench.tracking import atomic_write_text

if TYPE_CHECKING:
    from mlmt_bench.report.runs import RunRecord

#: a turn's text in the browser is cut after this many characters (500 problems × the arms' turns)
MAX_TURN_CHARS = 1500
_ARROW = {"i->c": "✗→✓", "c->i": "✓→✗", "i->i": "✗→✗", "c->c": "✓→✓"}
_CSS = """
.filters{position:sticky;top:0;background:#fff;padding:.5em 0;border-bottom:1px solid #ddd;z-index:2}
.filters label{margin-right:1em}.filters button{margin-right:.4em}
article.prob{border:1px solid #d4d4d8;border-radius:6px;padding:.4em .9em;margin:1em 0}
article.prob[hidden]{display:none}.prob h3{margin:.3em 0}
.prob table{width:100%;table-layout:fixed}.prob td pre{max-height:12em}
.prob td{font-size:.9em}.prob .turn{margin:0;font-size:.9em;min-width:0}
.ep{display:grid;grid-template-columns:repeat(auto-fit,minmax(14em,1fr));gap:.2em .8em}
"""


def _arm_row(arm: str, row: ProblemRow, baseline: str | None) -> str:
    out = row.arms.get(arm)
    badge = "<span class=badge>baseline</span>" if arm == baseline else ""
    if out is None:
        return f"<tr><th>{esc(arm)}{badge}</th><td colspan=2>not evaluated on this problem</td></tr>"
    seeds = ", ".join(f"s{seed if seed is not None else '?'} {_ARROW[t]}"
                      for (seed, _, _), t in zip(out.runs, out.transitions))
    episode = (f"<div class=ep>{''.join(_turn(t) for t in out.episode)}</div>" if out.episode
               else "<span class=sub>no logged episode</span>")
    which = f"<div class=sub>episode of seed {esc(out.episode_seed)}</div>" if out.episode else ""
    return f"<tr><th>{esc(arm)}{badge}<div class=sub>{esc(seeds)}</div>{which}</th><td>{episode}</td></tr>"


def _turn(t: dict[str, Any]) -> str:
    """A turn, compactly (a page of 500 problems × every arm): its kind, who wrote a feedback, its
    verdict (✓ right, else the verifier's word), a finish other than a stop, and its text (cut
    after ``MAX_TURN_CHARS``, said)."""
    text = str(t.get("text") or "")
    kind = str(t.get("kind", "?"))
    facts = [f"({t.get('policy')})" if kind == "feedback" and t.get("policy") else "",
             "✓" if t.get("verdict") == "ok" else f"✗ {t['verdict']}" if t.get("verdict") else "",
             f"finish: {t['finish_reason']}" if t.get("finish_reason") not in (None, "stop") else "",
             f"(cut: {len(text)} characters)" if len(text) > MAX_TURN_CHARS else ""]
    return (f"<div class=turn><b>{esc(kind)}</b> {esc(' '.join(f for f in facts if f))}"
            f"<pre>{esc(text[:MAX_TURN_CHARS])}</pre></div>")


def _card(row: ProblemRow, arms: list[str], baseline: str | None) -> str:
    tokens = " ".join(sorted({f"{i}:{t.replace('->', '')}" for i, arm in enumerate(arms) if arm in row.arms
                              for t in row.arms[arm].transitions}))
    text = f"<pre>{esc(row.text)}</pre>" if row.text is not None else "<p class=sub>(statement not recorded)</p>"
    gold = f"<code>{esc(row.gold)}</code>" if row.gold is not None else DASH
    cells = "".join(_arm_row(arm, row, baseline) for arm in arms)
    return (f"<article class=prob data-t=\"{esc(tokens)}\"><h3>problem <code>{esc(row.problem_id)}</code></h3>"
            f"{text}<p>gold answer: {gold}</p><table><colgroup><col style='width:14em'><col></colgroup>"
            f"{cells}</table></article>")


def render_problems(summary: dict[str, Any], loaded: dict[str, list[RunRecord]]) -> str:
    """The problem browser of a :func:`~mlmt_bench.report.compare.build_comparison` summary."""
    title = f"{summary['title'] or 'Comparison'}: problems"
    rows = problem_rows(loaded)
    arms = list(loaded)
    arm_options = "".join(f"<option value='{i}'>{esc(a)}</option>" for i, a in enumerate(arms))
    t_options = "".join(f"<option value='{k.replace('->', '')}'>{esc(label)}</option>" for k, label in TRANSITIONS)
    known = sum(r.text is not None for r in rows)
    lede = (f"<p class=lede>Every problem of the final evaluation ({len(rows)}; statements known for {known}): "
            "each arm's transition on every seed (✗→✓: a wrong attempt refined to a right final answer; a "
            "single-turn arm's final answer is its attempt) and one logged episode where a run logged one (an "
            "evaluation logs every problem's episode only at the final step, with eval.final_samples; a published "
            "report keeps those its index.html shows). Filter by arm and transition: a problem shows when that "
            "arm had that transition on some seed. <a href='index.html'>Back to the results</a>.</p>")
    filters = ("<div class=filters><label>arm <select id=f-arm><option value=''>any</option>"
               f"{arm_options}</select></label><label>transition <select id=f-t><option value=''>any</option>"
               f"{t_options}</select></label><button id=prev type=button>previous</button>"
               "<button id=next type=button>next</button><span id=count></span></div>")
    cards = "\n".join(_card(r, arms, summary["baseline"]) for r in rows)
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta http-equiv='Content-Security-Policy' content=\"{page_script.csp(page_script.BROWSER_JS)}\">"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{esc(title)}</title><style>{PAGE_CSS}{_CSS}</style></head><body>\n"
            f"<h1>{esc(title)}</h1>\n{lede}\n{filters}\n{cards}\n"
            f"<script>{page_script.BROWSER_JS}</script>\n</body></html>\n")


def write_problems(summary: dict[str, Any], loaded: dict[str, list[RunRecord]], path: Path) -> Path:
    """:func:`render_problems`, written atomically to ``path``."""
    atomic_write_text(Path(path), render_problems(summary, loaded))
    return Path(path)
