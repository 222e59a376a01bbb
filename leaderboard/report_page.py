"""The single-run report's fixed parts: its jinja2 template and the CSS it adds.

Why beside :mod:`leaderboard.page` and not in it: the two pages share the stylesheet, the
sorting script and the Content-Security-Policy (so they look and behave alike, and both are
one offline file), but their sections differ completely. The same rules hold: no reference
to anything outside the page, every value from the data inserted through jinja2's
autoescaping, only the SVG figures (escaped by matplotlib) and these constants marked safe.
"""

from __future__ import annotations

from cfl_bench.leaderboard.page import CSS

REPORT_CSS = (
    CSS
    + """
.badge { display: inline-block; padding: 0.05rem 0.55rem; border-radius: 0.3rem;
         font-weight: 600; font-size: 0.95rem; vertical-align: middle; }
.badge-finished { background: #e3f4e8; color: #1b6b35; }
.badge-diverged, .badge-failed { background: #fbe9ea; color: var(--bad); }
.badge-unfinished { background: #fff3dc; color: var(--warn); }
.notice { border-left: 4px solid var(--warn); background: #fffaf0; padding: 0.5rem 0.8rem;
          margin: 0.8rem 0; }
.notice.bad { border-left-color: var(--bad); background: #fdf3f3; }
dl.facts { display: grid; grid-template-columns: max-content minmax(0, 1fr);
           gap: 0.15rem 1.2rem; margin: 0.6rem 0; }
dl.facts dt { color: var(--muted); }
dl.facts dd { margin: 0; overflow-wrap: anywhere; }
table.metrics td.what { color: var(--muted); }
td.wrap, dd.wrap { overflow-wrap: anywhere; }
caption { text-align: left; color: var(--muted); font-size: 0.85rem; padding: 0.2rem 0; }
table.class-table, table.client-acc { margin-bottom: 1rem; }
figure.synthetic img { image-rendering: pixelated; max-width: 100%; height: auto; }
"""
)

TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{{ csp }}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="cfl-bench report">
<title>cfl-bench report · {{ run.strategy }} · {{ run.stream }} · seed {{ run.seed }}</title>
<style>{{ css }}</style>
</head>
<body>
<header>
<h1>{{ run.strategy }} on {{ run.stream }} · seed {{ run.seed }}
<span class="badge badge-{{ status }}" id="run-status" data-status="{{ status }}">
{{ status }}</span></h1>
<p class="lead mono">{{ run.path }}</p>
{% if status == "unfinished" %}
<div class="notice" id="unfinished-notice"><strong>This run has not finished</strong>
(no summary.json: it is still running, or it was stopped before its end).
{% if message %}{{ message }}. {% endif %}
The page shows what records.csv holds so far: {{ progress }}. Final metrics (the "_T" values)
stay empty until the last task has ended.</div>
{% elif status == "diverged" %}
<div class="notice bad" id="diverged-notice"><strong>This run diverged</strong>: {{ message }}.
Its numbers describe a broken model; the leaderboard never averages it.</div>
{% elif status == "failed" %}
<div class="notice bad" id="failed-notice"><strong>This run failed</strong>: {{ message }}.
The page shows the records it wrote before it stopped: {{ progress }}.</div>
{% endif %}
{% for note in notes %}
<div class="notice">{{ note }}</div>
{% endfor %}
<dl class="facts">
<dt>protocol</dt><dd>{{ run.protocol_summary }}</dd>
<dt>progress</dt><dd>{{ progress }}</dd>
<dt>protocol hash</dt><dd class="mono">{{ run.protocol_hash }}</dd>
<dt>config hash</dt><dd class="mono">{{ run.config_hash }}</dd>
</dl>
<nav><ul>
<li><a href="#results">Results</a></li>
<li><a href="#tasks">Per task: accuracy, forgetting, memory drift</a></li>
<li><a href="#rounds">Per round: loss and communication</a></li>
<li><a href="#clients">Clients: spread, buffer drift, data</a></li>
{% if image_sets %}
<li><a href="#synthetic">Synthetic images</a></li>
{% endif %}
<li><a href="#configuration">Configuration</a></li>
<li><a href="#provenance">Provenance and cost</a></li>
</ul></nav>
</header>
<main>
<section id="results">
<h2>Results</h2>
<p class="muted">Accuracies in %, the <em>final</em> evaluation of each task (never the best
round); "–" where a value does not exist (yet). Definitions: docs/metrics.md.</p>
<div class="table-wrap">
<table class="metrics">
<thead><tr><th>metric</th><th>value</th><th>what it is</th></tr></thead>
<tbody>
{% for m in metrics %}
<tr><th scope="row">{{ m.label }}</th><td class="num">{{ m.text }}</td>
<td class="what">{{ m.what }}</td></tr>
{% endfor %}
</tbody>
</table>
</div>
</section>
<section id="tasks">
<h2>Per task: accuracy, forgetting, memory drift</h2>
{{ figures_block(task_figures, "No task has ended yet, so there is no per-task measurement.") }}
</section>
<section id="rounds">
<h2>Per round: loss and communication</h2>
{{ figures_block(round_figures, "No round has finished yet.") }}
{% if payloads %}
<h3>Bytes by payload (whole run)</h3>
<div class="table-wrap">
<table class="sortable payloads">
<thead><tr><th>direction</th><th>payload</th><th>bytes</th><th>exact</th></tr></thead>
<tbody>
{% for p in payloads %}
<tr><td>{{ p.direction }}</td><td class="mono">{{ p.payload }}</td>
<td class="num" data-sort="{{ p.sort }}">{{ p.bytes }}</td>
<td class="num" data-sort="{{ p.sort }}">{{ p.exact }}</td></tr>
{% endfor %}
</tbody>
</table>
</div>
{% endif %}
</section>
<section id="clients">
<h2>Clients: spread, buffer drift, data</h2>
{{ figures_block(client_figures, "No client measurement was recorded yet.") }}
{% if client_rows %}
<details><summary>accuracy of every client at each task end</summary>
<div class="table-wrap">
<table class="sortable client-acc">
<caption>accuracy (%) of each client's local model at the end of task 1, 2, …</caption>
<thead><tr><th>client</th>{% if offsets %}<th>delay (rounds)</th>{% endif %}
{% for t in client_tasks %}<th>task {{ t }}</th>{% endfor %}</tr></thead>
<tbody>
{% for row in client_rows %}
<tr><td class="num" data-sort="{{ row.client }}">{{ row.client }}</td>
{% if offsets %}<td class="num" data-sort="{{ row.delay }}">{{ row.delay }}</td>{% endif %}
{% for c in row.cells %}<td class="num" data-sort="{{ c.sort }}">{{ c.text }}</td>{% endfor %}</tr>
{% endfor %}
</tbody>
</table>
</div>
</details>
{% endif %}
{% if class_tables %}
<details><summary>samples per client and class, every task (exact counts)</summary>
{% for table in class_tables %}
<div class="table-wrap">
<table class="sortable class-table" data-task="{{ table.task }}">
<caption>task {{ table.task }}: training samples per client (rows) and class (columns)</caption>
<thead><tr><th>client</th>{% for c in table.classes %}<th>{{ c }}</th>{% endfor %}
<th>total</th></tr></thead>
<tbody>
{% for row in table.rows %}
<tr><td class="num" data-sort="{{ row.client }}">{{ row.client }}</td>
{% for v in row.counts %}<td class="num" data-sort="{{ v }}">{{ v }}</td>{% endfor %}
<td class="num" data-sort="{{ row.total }}">{{ row.total }}</td></tr>
{% endfor %}
</tbody>
<tfoot><tr><th>total</th>{% for v in table.totals %}<td class="num">{{ v }}</td>{% endfor %}
</tr></tfoot>
</table>
</div>
{% endfor %}
</details>
{% elif class_tables is none %}
<p class="muted">This run did not record which classes each client holds.</p>
{% endif %}
</section>
{% if image_sets %}
<section id="synthetic">
<h2>Synthetic images</h2>
<p class="muted">What the server synthesised from the global model at each task end (the
images the clients distil on in the next task): one row per class asked for (the first
10 classes, ascending), its first 8 images. The PNGs are in the run folder's
synthetic-images/.</p>
{% for image in image_sets %}
<figure class="synthetic" id="synthetic-{{ image.name }}">
<img src="{{ image.src }}" alt="synthetic images {{ image.name }}" width="{{ image.width }}"
height="{{ image.height }}">
<figcaption>{{ image.caption }}</figcaption>
</figure>
{% endfor %}
</section>
{% endif %}
<section id="configuration">
<h2>Configuration</h2>
<p>{{ run.protocol_summary }}</p>
{% if components %}
<h3>Strategy components</h3>
<div class="table-wrap">
<table class="components">
<thead><tr><th>component</th><th>roles</th><th>options</th></tr></thead>
<tbody>
{% for c in components %}
<tr><td class="mono">{{ c.name }}</td><td>{{ c.roles }}</td>
<td class="mono wrap">{{ c.options }}</td></tr>
{% endfor %}
</tbody>
</table>
</div>
{% endif %}
{% if stream_facts %}
<h3>Stream</h3>
<dl class="facts">
{% for key, value in stream_facts %}<dt>{{ key }}</dt><dd class="wrap">{{ value }}</dd>
{% endfor %}
</dl>
{% endif %}
<details><summary>all options (config.json "config")</summary>
<pre>{{ options_json }}</pre></details>
<details><summary>full protocol (config.json "protocol")</summary>
<pre>{{ protocol_json }}</pre></details>
</section>
<section id="provenance">
<h2>Provenance and cost</h2>
<dl class="facts">
<dt>git commit</dt><dd class="mono">{{ git_commit }}</dd>
{% for key, value in machine %}<dt>{{ key }}</dt><dd class="mono wrap">{{ value }}</dd>
{% endfor %}
{% for key, value in costs %}<dt>{{ key }}</dt><dd>{{ value }}</dd>
{% endfor %}
</dl>
<h3>Package versions</h3>
<div class="table-wrap">
<table class="sortable packages">
<thead><tr><th>package</th><th>version</th></tr></thead>
<tbody>
{% for name, version in packages %}
<tr><td class="mono">{{ name }}</td><td class="mono">{{ version }}</td></tr>
{% endfor %}
</tbody>
</table>
</div>
</section>
</main>
<footer>Generated by <code>cfl-bench report</code> from the run's records alone (no
timestamps): the same run directory always gives the same page.</footer>
<script>{{ script }}</script>
</body>
</html>
"""

#: The figures of one section, or a sentence saying why there are none (a macro, so the
#: three sections share one piece of markup).
FIGURES_MACRO = """{% macro figures_block(figures, empty) %}
{% if figures %}
<div class="figures">
{% for f in figures %}
<figure>
{{ f.svg }}
<figcaption id="{{ f.id }}-t">{{ f.caption }}</figcaption>
</figure>
{% endfor %}
</div>
{% else %}
<p class="muted">{{ empty }}</p>
{% endif %}
{% endmacro %}
"""
