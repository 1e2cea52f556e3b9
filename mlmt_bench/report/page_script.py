"""The results page's one script (sortable tables), the problem browser's (filters and pages), and
the Content-Security-Policy that lets a page's own script, and nothing else, run.

A header cell of class ``sort`` sorts its table's rows (the arms) by that column when clicked.
The first click puts the largest value first, the next the smallest; a cell's
value is its ``data-v`` attribute when it has one (empty: no value), else the number its text
starts with (``46.0% ± 2.1`` → 46.0, ``+7.3 pp`` → 7.3, ``60.0k`` → 60,000); cells without a value
go last, ties keep their order. Headers name the sort in ``aria-sort``.

The page is built from model outputs, so every such text is escaped (:func:`mlmt_bench.report.html.esc`);
the policy is the second wall: no script runs but this one (its sha256 is the only script source),
no request leaves the page (``default-src 'none'``), images only from ``data:`` URLs.
"""

from __future__ import annotations

import base64
import hashlib

SORT_JS = r"""(function () {
  "use strict";
  var SCALE = {k: 1e3, M: 1e6, G: 1e9};
  function value(cell) {
    if (!cell) return NaN;
    var v = cell.getAttribute("data-v");
    if (v !== null) return v === "" ? NaN : parseFloat(v);
    var first = cell.firstChild;
    var text = (first && first.nodeType === 3 ? first.nodeValue : cell.textContent).trim();
    var m = /^([+\-\u2212]?\d+(?:\.\d+)?(?:e[+\-]?\d+)?)([kMG]?)/.exec(text);
    return m ? parseFloat(m[1].replace("\u2212", "-")) * (SCALE[m[2]] || 1) : NaN;
  }
  function order(values, descending) {
    var idx = values.map(function (_, i) { return i; });
    return idx.sort(function (a, b) {
      var x = values[a], y = values[b];
      if (isNaN(x) || isNaN(y)) return isNaN(x) === isNaN(y) ? a - b : (isNaN(x) ? 1 : -1);
      return x === y ? a - b : (descending ? y - x : x - y);
    });
  }
  document.addEventListener("click", function (event) {
    var th = event.target.closest("th.sort");
    if (!th) return;
    var table = th.closest("table"), rows = [].slice.call(table.rows);
    var descending = th.getAttribute("aria-sort") !== "descending";
    [].forEach.call(table.querySelectorAll("th[aria-sort]"), function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", descending ? "descending" : "ascending");
    var body = rows.slice(1), col = th.cellIndex;
    order(body.map(function (row) { return value(row.cells[col]); }), descending)
      .forEach(function (i) { body[i].parentNode.appendChild(body[i]); });
  });
})();"""

#: problems.html's script: shows the problem cards (``article.prob``) that match the arm and the
#: transition chosen (``select#f-arm``, ``select#f-t``; a card's ``data-t`` lists its
#: ``<arm index>:<transition>`` of every run, a transition as ``ic``: incorrect, then correct), a
#: page of ``PER_PAGE`` at a time (buttons ``#prev``, ``#next``; ``#count`` says which). It sets
#: attributes and text only, never markup.
BROWSER_JS = r"""(function () {
  "use strict";
  var PER_PAGE = 25, page = 0;
  var cards = [].slice.call(document.querySelectorAll("article.prob"));
  var arm = document.getElementById("f-arm"), tr = document.getElementById("f-t");
  var prev = document.getElementById("prev"), next = document.getElementById("next");
  var count = document.getElementById("count");
  function matches(card) {
    var a = arm.value, t = tr.value;
    if (a === "" && t === "") return true;
    return (card.getAttribute("data-t") || "").split(" ").some(function (token) {
      var i = token.indexOf(":");
      return (a === "" || token.slice(0, i) === a) && (t === "" || token.slice(i + 1) === t);
    });
  }
  function show() {
    var shown = cards.filter(matches), pages = Math.max(1, Math.ceil(shown.length / PER_PAGE));
    page = Math.min(page, pages - 1);
    cards.forEach(function (c) { c.hidden = true; });
    shown.slice(page * PER_PAGE, (page + 1) * PER_PAGE).forEach(function (c) { c.hidden = false; });
    count.textContent = shown.length ? (page * PER_PAGE + 1) + "–" +
      Math.min(shown.length, (page + 1) * PER_PAGE) + " of " + shown.length + " problems (page " +
      (page + 1) + " of " + pages + ")" : "no problem matches";
    prev.disabled = page === 0;
    next.disabled = page >= pages - 1;
  }
  arm.addEventListener("change", function () { page = 0; show(); });
  tr.addEventListener("change", function () { page = 0; show(); });
  prev.addEventListener("click", function () { page -= 1; show(); window.scrollTo(0, 0); });
  next.addEventListener("click", function () { page += 1; show(); window.scrollTo(0, 0); });
  show();
})();"""


def csp(script: str) -> str:
    """The Content-Security-Policy of a page whose one script is ``script`` (a <meta http-equiv>
    in its head): nothing fetched, images only from ``data:`` URLs, no other script."""
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode("ascii")
    return f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'sha256-{digest}'"


#: index.html's Content-Security-Policy
CSP = csp(SORT_JS)
