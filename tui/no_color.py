"""NO_COLOR (or `--color none`): no colour at all, not even greys.

Textual honours NO_COLOR by turning every colour into a grey (its Monochrome filter), and a 256-colour terminal then
gets those greys as colours (`ESC[38;5;240m`): frames, panels and toasts keep escape codes NO_COLOR asks a program to
leave out. This filter drops every colour instead, as Textual's NoColor does for native ANSI themes, and keeps what a
background colour alone said (a highlighted option, the active tab, a toast) as reverse video, which NO_COLOR allows.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual.color import Color
from textual.filter import LineFilter

DEFAULT_COLORS = Style(color="default", bgcolor="default")
STANDS_OUT = 0.25  # a background this much lighter or darker than the screen's marks something (a highlight)


class Colourless(LineFilter):
    """Removes every colour from segments; a background that stood out becomes reverse video."""

    def apply(self, segments: list[Segment], background: Color) -> list[Segment]:
        out = []
        for text, style, control in segments:
            if style is None:
                out.append(Segment(text, None, control))
                continue
            plain = style + DEFAULT_COLORS
            if style.bgcolor is not None and not style.bgcolor.is_default and _stands_out(style, background):
                plain += Style(reverse=not style.reverse)
            out.append(Segment(text, plain, control))
        return out


def _stands_out(style: Style, background: Color) -> bool:
    r, g, b = style.bgcolor.get_truecolor()
    return abs(Color(r, g, b).brightness - background.brightness) > STANDS_OUT
