"""The results page's one script (sortable tables) and the Content-Security-Policy that lets it,
and nothing else, run.

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

#: the page's Content-Security-Policy (a <meta http-equiv> in its head)
CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
       f"script-src 'sha256-{base64.b64encode(hashlib.sha256(SORT_JS.encode()).digest()).decode('ascii')}'")
