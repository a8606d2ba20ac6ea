"""Links to any view: the recorded race, the tab, the Step-through method and step, and the presenter
and homework modes live in the page's URL (``?race=nvidia-h200/qa&tab=steps&method=mirror&step=30``),
so a reload or an opened link shows the same view and a lecturer can send a class one moment.

The browser writes the URL as the view changes (``JS``: each event's ``js=`` calls ``mirrorView``), once
the server has read it when the page opened (``restore``, from ``gr.Request.query_params``) and set the
controls, whose usual events then open the race and draw the step. A live race is not stored, so it has
no link: its exported trace is the way to share it.
"""
from __future__ import annotations

from pathlib import Path

import gradio as gr

from . import replay

TABS = ("race", "utilisation", "steps", "export", "whatif")  # the page's tabs' ids, in order
LIVE_NOTE = ("A live race is not stored, so it has no link: share its exported trace (**Export** tab). "
             "A recorded race's link opens it, on the same tab, method and step.")


def race_key(path: str | Path) -> str:
    """A recorded race's name in a link: its file under ``app/recorded`` without ``.json``
    ("nvidia-h200/qa")."""
    return Path(path).resolve().relative_to(replay.RECORDED.resolve()).with_suffix("").as_posix()


def race_path(key: str | None) -> str | None:
    """The dropdown's value for a link's race name, or None for a name that is no recorded race (only
    the dropdown's own races open: a link cannot name another file)."""
    if not key:
        return None
    paths = {race_key(path): path for _, path in replay.recorded_races()}
    return paths.get(key)


def flag(params, name: str) -> bool:
    """Whether a query parameter is on (``?present=1``, ``?present=true``, ``?present``)."""
    return name in params and params[name].lower() not in ("0", "false", "no", "off")


def method_steps(path: str) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """A recorded race's Step-through choices ((title, method), methods that ran) and each one's last step."""
    _, _, results = replay.load_race(path)
    ran = [r for r in results.values() if r.trace.steps]
    return [(r.title, r.method) for r in ran], {r.method: r.trace.steps[-1].index for r in ran}


def restore(request: gr.Request):
    """The view a link names, as updates of (recorded race, tabs, Step-through method, step, presenter,
    homework, the opened race's trigger). Unnamed or unknown parts are left as they are."""
    params = request.query_params if request else {}
    path = race_path(params.get("race"))
    tab = params.get("tab") if params.get("tab") in TABS else None
    method, slider = gr.update(), gr.update()
    if path:
        choices, last = method_steps(path)
        if params.get("method") in last:
            method = gr.update(choices=choices, value=params["method"])
            step = params.get("step", "0")
            slider = gr.update(maximum=max(last[params["method"]], 1),
                               value=min(int(step), last[params["method"]]) if step.isdigit() else 0)
    return (gr.update(value=path) if path else gr.update(), gr.Tabs(selected=tab) if tab else gr.update(), method,
            slider, flag(params, "present"), flag(params, "homework"), path or "")


# The browser's side: keep the URL in step with the view, and copy it. Loaded once in the page's head.
JS = """
<script>
window.mirrorView = {
  ready: false,  // until the server has read the link (restore), the URL is left as it came: a tab's select
                 // event, fired as the page mounts, would otherwise overwrite the link's tab
  set(key, value) {
    if (!this.ready) return;
    const url = new URL(window.location.href);
    if (value === null || value === undefined || value === '' || value === false) url.searchParams.delete(key);
    else url.searchParams.set(key, value === true ? '1' : String(value));
    window.history.replaceState(null, '', url);
  },
  race(path) {  // the dropdown's value is the race's file: its name under recorded/ goes in the link
    this.set('race', path ? path.split('/recorded/').pop().replace(/\\.json$/, '') : null);
    if (!path) { this.set('method', null); this.set('step', null); }
  },
  tab(id) {  // a tab shown: in the link, and its charts at the tab's width (drawn while it was hidden,
            // as when a link opened another tab, a chart takes a default width)
    this.set('tab', id);
    setTimeout(() => document.querySelectorAll('.js-plotly-plot').forEach(
      (el) => el.offsetParent && window.Plotly && window.Plotly.Plots.resize(el)), 100);
  },
  async copy() {
    const link = window.location.href;
    try { await navigator.clipboard.writeText(link); } catch (e) { /* not a secure page: the box shows it */ }
    return link;
  },
};
</script>
"""
