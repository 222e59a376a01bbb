"""The report's fixed parts: the jinja2 page template, its CSS and its sorting script.

Why constants in a module rather than template files: the page must be one self-contained
file, and Python modules always ship with the package (non-Python files would need package
data configuration). Nothing here refers to anything outside the page — no CDN, no web
fonts, no images — and the script is tiny: it sorts ``table.sortable`` by a clicked header
(numeric where cells carry ``data-sort``, natural text order otherwise; missing values last
in both directions; click again to reverse). Every value from the data is inserted through
jinja2's autoescaping; only the SVG figures (escaped by matplotlib) and these constants are
marked safe.
"""

from __future__ import annotations

CSS = """
:root { --fg: #1d232b; --muted: #5b6570; --line: #d5dae0; --head: #eef1f4; --warn: #9a5b00;
        --bad: #a4262c; font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
body { color: var(--fg); margin: 0 auto; max-width: 1280px; padding: 1rem 1.25rem 3rem;
       box-sizing: border-box;
       line-height: 1.45; font-size: 15px; }
h1 { font-size: 1.6rem; margin-bottom: 0.2rem; }
h2 { font-size: 1.3rem; margin-top: 2.5rem; border-bottom: 2px solid var(--line);
     padding-bottom: 0.2rem; }
h3 { font-size: 1.05rem; margin-top: 1.6rem; }
code, pre, .mono { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace;
                   font-size: 0.86em; }
pre { background: #f6f8fa; padding: 0.6rem; overflow-x: auto; }
p.lead, .muted { color: var(--muted); }
nav ul { padding-left: 1.2rem; }
table { border-collapse: collapse; margin: 0.6rem 0; font-size: 0.88rem; }
th, td { border: 1px solid var(--line); padding: 0.25rem 0.5rem; vertical-align: top; }
th { background: var(--head); text-align: left; white-space: nowrap; }
td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
table.leaderboard th { white-space: normal; vertical-align: bottom; min-width: 3.5rem; }
table.leaderboard { font-size: 0.85rem; }
table.leaderboard th, table.leaderboard td { padding: 0.25rem 0.4rem; }
table.leaderboard td.num { white-space: normal; }
td.name, td.path, td.flag { overflow-wrap: anywhere; }
td.flag { min-width: 6rem; }
table.sortable th { cursor: pointer; user-select: none; }
table.sortable th::after { content: " \\2195"; color: #9aa3ad; }
table.sortable th[aria-sort="ascending"]::after { content: " \\25B2"; color: var(--fg); }
table.sortable th[aria-sort="descending"]::after { content: " \\25BC"; color: var(--fg); }
td.flag, span.flag { color: var(--warn); }
td.status-failed, td.status-diverged { color: var(--bad); font-weight: 600; }
td.status-incomplete, td.status-duplicate { color: var(--warn); font-weight: 600; }
.table-wrap { overflow-x: auto; max-width: 100%; }
td.message { white-space: pre-wrap; max-width: 40rem; }
.figures { display: flex; flex-wrap: wrap; gap: 0.5rem 2rem; align-items: flex-start; }
figure { margin: 1rem 0; flex: 0 1 auto; max-width: 100%; }
figcaption { color: var(--muted); font-size: 0.85rem; max-width: 36rem; }
svg.plot { max-width: 100%; height: auto; }
details summary { cursor: pointer; color: var(--muted); }
footer { margin-top: 3rem; color: var(--muted); font-size: 0.85rem; }
"""

SORT_JS = """
(function () {
  "use strict";
  function keyOf(cell) {
    var raw = cell ? cell.getAttribute("data-sort") : null;
    if (raw === null) {
      var text = cell ? cell.textContent.trim() : "";
      return text === "" ? { missing: true } : { text: text };
    }
    var value = parseFloat(raw);
    return isNaN(value) ? { missing: true } : { number: value };
  }
  function compare(a, b) {
    if (a.number !== undefined && b.number !== undefined) { return a.number - b.number; }
    var ta = a.text !== undefined ? a.text : String(a.number);
    var tb = b.text !== undefined ? b.text : String(b.number);
    return ta.localeCompare(tb, undefined, { numeric: true, sensitivity: "base" });
  }
  function sortTable(table, header, column) {
    var ascending = header.getAttribute("aria-sort") !== "ascending";
    var headers = table.tHead.rows[0].cells;
    for (var h = 0; h < headers.length; h++) { headers[h].removeAttribute("aria-sort"); }
    header.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows).map(function (row, index) {
      return { row: row, index: index, key: keyOf(row.cells[column]) };
    });
    rows.sort(function (a, b) {
      if (a.key.missing || b.key.missing) {
        if (a.key.missing && b.key.missing) { return a.index - b.index; }
        return a.key.missing ? 1 : -1;
      }
      var order = compare(a.key, b.key);
      return (ascending ? order : -order) || a.index - b.index;
    });
    rows.forEach(function (item) { body.appendChild(item.row); });
  }
  var tables = document.querySelectorAll("table.sortable");
  Array.prototype.forEach.call(tables, function (table) {
    var headers = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(headers, function (header, column) {
      header.tabIndex = 0;
      header.addEventListener("click", function () { sortTable(table, header, column); });
      header.addEventListener("keydown", function (event) {
        if (event.key === "Enter" || event.key === " ") {
          event.preventDefault();
          sortTable(table, header, column);
        }
      });
    });
  });
})();
"""

TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{{ csp }}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="cfl-bench leaderboard">
<title>cfl-bench leaderboard</title>
<style>{{ css }}</style>
</head>
<body>
<header>
<h1>cfl-bench leaderboard</h1>
<p class="lead">{{ counts.runs }} run director{{ "y" if counts.runs == 1 else "ies" }},
{{ counts.protocols }} protocol{{ "" if counts.protocols == 1 else "s" }},
{{ counts.rows }} leaderboard row{{ "" if counts.rows == 1 else "s" }};
{% if problems %}
{{ counts.problems }} run{{ "" if counts.problems == 1 else "s" }} not finished
(see <a href="#runs">runs not finished</a>).
{% else %}
all {{ counts.runs }} run{{ "" if counts.runs == 1 else "s" }} finished.
{% endif %}
Values are mean ± <strong class="std-kind" data-std-kind="{{ std_kind }}">{{ std_text }}</strong>
over the finished seeds (the CSV's std_kind column says the same); "–" where a single seed
gives no deviation (under either convention: one seed has no spread) or a value is missing.
Accuracies are the <em>final</em> evaluation (never the best round), in %. Fgt_T is
Chaudhry's forgetting (for each old task, its best accuracy from the end of its own training
up to the previous task, minus its accuracy now; evaluations made before a task was trained
never count); the CSV also has the clipped Mammoth/FedGP rule (Fgt_T_clipped).</p>
<nav><ul>
{% for p in protocols %}
<li><a href="#{{ p.anchor }}">{{ p.stream }} · {{ p.scenario_label }} ·
<span class="mono">{{ p.hash }}</span></a> ({{ p.rows|length }}
strateg{{ "y" if p.rows|length == 1 else "ies" }})</li>
{% endfor %}
{% if problems %}
<li><a href="#runs">Runs not finished</a></li>
{% endif %}
<li><a href="#all-runs">All runs</a></li>
<li><a href="#provenance">Provenance</a></li>
</ul></nav>
</header>
<main>
{% for p in protocols %}
<section class="protocol" id="{{ p.anchor }}" data-protocol-hash="{{ p.hash }}">
<h2>{{ p.stream }} · {{ p.scenario_label }} · protocol <span class="mono">{{ p.hash }}</span></h2>
<p>{{ p.summary }}</p>
<details><summary>full protocol</summary><pre>{{ p.protocol_json }}</pre></details>
<p class="legend muted" data-std-kind="{{ std_kind }}">{{ p.legend }}</p>
<p class="significance muted">{{ p.significance }}</p>
<div class="table-wrap">
<table class="sortable leaderboard" data-protocol-hash="{{ p.hash }}">
<thead><tr>
{% for c in p.columns %}<th scope="col" title="{{ c.title }}">{{ c.label }}</th>{% endfor %}
</tr></thead>
<tbody>
{% for row in p.rows %}
<tr>
{% for cell in row %}<td{% if cell.sort is not none %} data-sort="{{ cell.sort }}"{% endif %}
{% if cell.cls %} class="{{ cell.cls }}"{% endif %}
{% if cell.title %} title="{{ cell.title }}"{% endif %}>{{ cell.text }}</td>{% endfor %}
</tr>
{% endfor %}
</tbody>
</table>
</div>
<div class="figures">
{% for f in p.figures %}
<figure>
{{ f.svg }}
<figcaption id="{{ f.id }}-t">{{ f.caption }}</figcaption>
</figure>
{% endfor %}
</div>
</section>
{% endfor %}
{% if problems %}
<section id="runs">
<h2>Runs not finished</h2>
<p>These runs are kept out of every mean; they are counted in the leaderboard's
n_diverged / n_failed / n_incomplete{{ " / n_damaged" if any_damaged else "" }} columns.</p>
<div class="table-wrap">
<table class="sortable problems">
<thead><tr><th>run directory</th><th>status</th><th>stream</th><th>strategy</th>
<th>seed</th><th>protocol</th><th>message</th></tr></thead>
<tbody>
{% for r in problems %}
<tr><td class="mono path">{{ r.path }}</td>
<td class="status-{{ r.status_style }}">{{ r.status }}</td>
<td>{{ r.stream }}</td><td class="name">{{ r.strategy }}</td><td class="num">{{ r.seed }}</td>
<td class="mono">{{ r.protocol_hash }}</td><td class="message">{{ r.message }}</td></tr>
{% endfor %}
</tbody>
</table>
</div>
</section>
{% endif %}
<section id="all-runs">
<h2>All runs</h2>
<details><summary>all {{ counts.runs }} run{{ "" if counts.runs == 1 else "s" }}</summary>
<div class="table-wrap">
<table class="sortable all-runs">
<thead><tr><th>run directory</th><th>status</th><th>strategy</th><th>seed</th>
<th>protocol</th><th>Acc_T (%)</th><th>git commit</th></tr></thead>
<tbody>
{% for r in all_runs %}
<tr><td class="mono path">{{ r.path }}</td>
<td class="status-{{ r.status_style }}">{{ r.status }}</td>
<td class="name">{{ r.strategy }}</td><td class="num">{{ r.seed }}</td>
<td class="mono">{{ r.protocol_hash }}</td>
<td class="num"{% if r.acc_sort is not none %} data-sort="{{ r.acc_sort }}"{% endif %}>
{{ r.acc }}</td><td class="mono">{{ r.git_commit }}</td></tr>
{% endfor %}
</tbody>
</table>
</div>
</details>
</section>
<section id="provenance">
<h2>Provenance</h2>
{% if flagged %}
<h3>Rows whose runs disagree</h3>
<ul>
{% for f in flagged %}
<li><span class="flag">{{ f.flag }}</span>: {{ f.strategy }} on {{ f.stream }}
(<span class="mono">{{ f.hash }}</span>) — commits {{ f.git_commit }}; packages
{{ f.packages }}</li>
{% endfor %}
</ul>
{% else %}
<p>Within every leaderboard row, all runs share package versions and git commit.</p>
{% endif %}
<h3>Git commits</h3>
<table class="sortable commits">
<thead><tr><th>commit</th><th>runs</th></tr></thead>
<tbody>
{% for c in commits %}
<tr><td class="mono">{{ c.value }}</td><td class="num" data-sort="{{ c.count }}">
{{ c.count }}</td></tr>
{% endfor %}
</tbody>
</table>
<h3>Package versions</h3>
<div class="table-wrap">
<table class="sortable packages">
<thead><tr>{% for name in package_names %}<th>{{ name }}</th>{% endfor %}<th>runs</th></tr>
</thead>
<tbody>
{% for row in package_rows %}
<tr>{% for v in row.versions %}<td class="mono">{{ v }}</td>{% endfor %}
<td class="num" data-sort="{{ row.count }}">{{ row.count }}</td></tr>
{% endfor %}
</tbody>
</table>
</div>
<h3>Machines</h3>
<div class="table-wrap">
<table class="sortable machines">
<thead><tr>{% for name in machine_keys %}<th>{{ name }}</th>{% endfor %}<th>runs</th></tr>
</thead>
<tbody>
{% for row in machine_rows %}
<tr>{% for v in row.cells %}<td class="mono">{{ v }}</td>{% endfor %}
<td class="num" data-sort="{{ row.count }}">{{ row.count }}</td></tr>
{% endfor %}
</tbody>
</table>
</div>
</section>
</main>
<footer>Generated by <code>cfl-bench leaderboard</code> from the run records alone (no
timestamps): the same run directories always give the same page.</footer>
<script>{{ script }}</script>
</body>
</html>
"""
