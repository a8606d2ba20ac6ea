"""The page's look: its theme and style sheet, and the presenter view for a projector.

The presenter view (the "Presenter view" box, or ``?present=1``) sets ``presenter`` on the page's body:
every text at 20 px or more, the charts' labels enlarged through their own layouts (Plotly's
``relayout``, since CSS cannot move a chart's axes to fit larger labels; each chart grows taller by the
same factor, so rows of labels keep apart), the tabs kept at the top while
scrolling, the explainer collapsed and the results as one compact table (app.results_table) with each
column's meaning written out. Homework mode (``?homework=1``) sets ``homework``, which shows the table
with its load marks.

The theme fixes a glyph glitch: Gradio's default theme declares Source Sans Pro at weights 400 and 600,
and the 600 file it ships holds only the letters "A" and "B"; bold text then took those two letters from
it and every other letter from the system's sans-serif, so the "A" of "EAGLE-2" and "AMD" stood out.
Declaring 400 and 700 uses the full bold file for every bold letter.
"""
from __future__ import annotations

import gradio as gr

THEME = gr.themes.Default(font=[gr.themes.LocalFont("Source Sans Pro", weights=(400, 700)), "ui-sans-serif",
                                "system-ui", "sans-serif"])
CHART_FONT = 18  # px: a Plotly chart's labels in the presenter view (its default is 12)
NOTE_FONT = 16  # px at least: a chart's annotations and marker labels there (10 to 11 by default)

# Gradio also copies each rule under its container's classes, which outrank a plain "body.presenter" rule;
# so the normal view's rules name the body too ("body:not(.presenter)"), and its copies never match.
CSS = """
body:not(.presenter):not(.homework) #results-table { display: none; }
body:not(.presenter) #small-target-race { display: none; }
table.results { border-collapse: collapse; width: 100%; margin: 4px 0; }
table.results th, table.results td { border-bottom: 1px solid #e5e7eb; padding: 2px 8px; text-align: right; }
table.results th[scope=row], table.results thead th:first-child { text-align: left; }
table.results td:last-child, table.results thead th:last-child { text-align: left; }
table.results .load-mark { font-size: 0.7em; font-weight: normal; color: #92400e; }
table.results th[data-load=no] .load-mark { color: #166534; }
.definitions { display: grid; grid-template-columns: max-content 1fr; gap: 0 12px; margin: 6px 0; color: #374151; }
.definitions dt { font-weight: 700; }
.definitions dd { margin: 0; }
#view-note { color: #4b5563; }

body.presenter { --text-xs: 18px; --text-sm: 20px; --text-md: 20px; --text-lg: 22px; --text-xl: 26px;
                 --block-label-text-size: 20px; --block-info-text-size: 18px; --block-title-text-size: 20px;
                 --section-header-text-size: 20px; --checkbox-label-text-size: 20px; --input-text-size: 20px;
                 --button-large-text-size: 20px; --button-medium-text-size: 20px; }
body.presenter .prose, body.presenter .prose * { font-size: 20px; }
body.presenter .prose h1 { font-size: 28px; }
body.presenter .card-head, body.presenter .card-models, body.presenter .card-metrics,
body.presenter .card .tokens, body.presenter .legend, body.presenter .badge,
body.presenter #step-text .tokens { font-size: 20px !important; }
body.presenter #how-it-works .idea { flex-basis: 45% !important; }  /* two pictures a row, each drawn larger */
body.presenter #how-it-works svg { max-width: 100% !important; }
body.presenter #how-it-works svg text { font-size: 11.5px; }  /* user units: about 20 px at that width */
body.presenter #intro .md > :not(h1), body.presenter #small-target, body.presenter #view-note, body.presenter #hover-note { display: none; }
body.presenter #intro h1 { margin: 0; }
body.presenter .gradio-container { overflow: clip; }  /* clip, not hidden: no scroll box, so the tabs can stick */
body.presenter #tabs > .tab-wrapper { position: sticky; top: 0; z-index: 20;
                                      background: var(--background-fill-primary); }
body.presenter #cards > div { min-width: 400px !important; }
"""

# The browser's side of the two modes; loaded once in the page's head, after app.links.JS.
JS = f"""
<script>
window.mirrorView.mode = function (name, on) {{  // 'presenter' or 'homework': the body's class and the link
  document.body.classList.toggle(name, !!on);
  this.set(name === 'presenter' ? 'present' : name, on ? '1' : null);
}};
window.mirrorView.chartFonts = function () {{  // presenter: every chart's labels enlarged, once per drawing
  if (!window.Plotly) return;
  const on = document.body.classList.contains('presenter');
  for (const el of document.querySelectorAll('.js-plotly-plot')) {{
    if (!el.layout || !el.offsetParent) continue;  // a hidden tab's chart: enlarged once shown, at its width
    if (on && (el.layout.font || {{}}).size === {CHART_FONT}) continue;  // enlarged since its last drawing
    if (!on && !el.dataset.presented) continue;  // never enlarged
    if (on) el.dataset.height = el.layout.height || el._fullLayout.height || '';
    el.dataset.presented = on ? '1' : '';
    const size = (s) => on ? Math.max(s || 0, {NOTE_FONT}) : null;
    const height = Number(el.dataset.height) || null;
    const grown = (n) => n && on ? n * {CHART_FONT} / 12 : n;  // taller by the fonts' factor: rows of labels keep apart
    const update = {{'font.size': on ? {CHART_FONT} : null}};
    if (height) update.height = grown(height);
    if (!on) update['margin.b'] = Number(el.dataset.bottom) || null;
    if (on) el.dataset.bottom = (el.layout.margin || {{}}).b ?? '';
    (el.layout.annotations || []).forEach((a, i) => {{
      update[`annotations[${{i}}].font.size`] = size((a.font || {{}}).size);
    }});
    if (on && height && (el.layout.legend || {{}}).orientation === 'h') {{
      // a legend under the chart goes to the chart's foot, in rows of about two entries, with room made
      // for it: its place was a share of the plot's height, which the enlarged axis labels reached
      const rows = Math.ceil(el.data.filter((t) => t.showlegend !== false).length / 2);
      const legend = rows * {CHART_FONT} * 2 + {CHART_FONT};
      Object.assign(update, {{'legend.yref': 'container', 'legend.y': 0, 'legend.yanchor': 'bottom',
                             height: grown(height) + legend, 'margin.b': legend + {CHART_FONT} * 4}});
    }} else if (!on) {{
      Object.assign(update, {{'legend.yref': null, 'legend.y': null, 'legend.yanchor': null}});
    }}
    window.Plotly.relayout(el, update);
    if (on) window.Plotly.restyle(el, {{'textfont.size': {NOTE_FONT}}});
  }}
}};
setInterval(() => window.mirrorView.chartFonts(), 700);
</script>
"""
