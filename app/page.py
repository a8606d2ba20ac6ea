"""The page's outputs by name. A handler returns (or yields) a :class:`Page` that names what it sets; ui.py
maps those names onto its components once (:class:`Outputs`), and each event lists its outputs by name,
so no handler depends on the order of an event's output list.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field


def keep():
    """An update that leaves a component as it is (``gr.update()``; gradio imported only when a page is made,
    so that the recording scripts' imports of ``app.replay`` stay light)."""
    import gradio as gr

    return gr.update()


@dataclass
class Page:
    """Values for the page's components, by name; a field left unset leaves its component as it is."""

    prompt: object = field(default_factory=keep)  # the prompt box
    status: object = field(default_factory=keep)  # the status line under the settings
    replay: object = field(default_factory=keep)  # the Replay button
    cards: dict = field(default_factory=dict)  # {method: its card's HTML or an update}; a card not named: as it is
    results: object = field(default_factory=keep)  # the race on the page, {method: Result} (a gr.State)
    clock: object = field(default_factory=keep)  # the replay clock, ms (None: the end), for the cursor
    timeline: object = field(default_factory=keep)  # the race's timeline
    zoom: object = field(default_factory=keep)  # one typical step of each method, zoomed
    utilisation: object = field(default_factory=keep)  # the Utilisation tab's chart
    files: object = field(default_factory=keep)  # the Export tab's downloads
    step_method: object = field(default_factory=keep)  # the Step-through's method choice


class Outputs:
    """The one mapping from a :class:`Page`'s names to ui.py's components: an event's output list by
    names (:meth:`of`), and a handler's pages as that list's values (:meth:`wrap`). ``cards`` is one
    component per method of ``names``."""

    def __init__(self, names: list[str], **components):
        unknown = set(components) - set(Page.__dataclass_fields__)
        assert not unknown, f"not a Page field: {unknown}"
        self.names, self.components = names, components

    def of(self, *fields: str) -> list:
        """The components of ``fields``, in order, for an event's ``outputs``."""
        return [c for name in fields for c in (self.components[name] if name == "cards" else [self.components[name]])]

    def values(self, page: Page, fields: tuple[str, ...]) -> tuple:
        """``page`` as the values of ``of(*fields)``, in the same order."""
        out = []
        for name in fields:
            if name == "cards":
                out += [page.cards[n] if n in page.cards else keep() for n in self.names]
            else:
                out.append(getattr(page, name))
        return tuple(out)

    def wrap(self, handler, *fields: str):
        """``handler``, which returns or yields pages, as Gradio calls it: each page as the values of
        ``of(*fields)``. Its signature (the API's parameter names) and its being a generator are kept."""
        single = len(self.of(*fields)) == 1  # Gradio takes one output's value alone, not in a tuple

        def values(page: Page):
            out = self.values(page, fields)
            return out[0] if single else out

        if inspect.isgeneratorfunction(handler):
            @functools.wraps(handler)
            def positional(*args, **kwargs):
                for page in handler(*args, **kwargs):
                    yield values(page)
        else:
            @functools.wraps(handler)
            def positional(*args, **kwargs):
                return values(handler(*args, **kwargs))
        return positional
