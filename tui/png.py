"""A terminal screen as a PNG: every cell of the app's screen drawn with its own colours, as a terminal shows it.

`vitsee-tui STORE --snapshot VIEW --out screen.png` uses it where an SVG will not do (a README that wants a picture,
an SVG renderer that drops no-break spaces or frays the half blocks). The screen is rendered as Textual renders
its SVG screenshot (the compositor's full update, through a truecolor rich Console), then each cell is painted:
its background, then its character in DejaVu Sans Mono (the font matplotlib ships, so no system font is needed).
The characters a heatmap and a line plot are made of are painted as shapes, not glyphs, so they fill their cell
exactly as a terminal draws them: the block elements (U+2580-U+259F: half and eighth blocks, quadrants, shades) and
the Braille patterns (U+2800-U+28FF, each dot of the 2 x 4 grid). A character the monospace font lacks is taken from
DejaVu Sans. Colours: rich's SVG export theme for the terminal's defaults; reverse swaps, dim halves toward the
background, bold takes the bold face, underline and strike draw their lines.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from functools import cache
from pathlib import Path

FONT_SIZE = 16  # DejaVu Sans Mono 16 px: a 10 x 19 px cell


@dataclass(frozen=True)
class Cell:
    """One character cell: its text (one character, or '' for the right half of a wide one) and colours."""

    char: str
    fg: tuple[int, int, int]
    bg: tuple[int, int, int]
    bold: bool = False
    underline: bool = False
    strike: bool = False
    width: int = 1  # 2 for a wide character


@cache
def _fonts() -> dict[str, object]:
    """Returns the faces: mono, mono bold, and the proportional fallback, from matplotlib's bundled DejaVu fonts."""
    import matplotlib
    from fontTools.ttLib import TTFont
    from PIL import ImageFont

    folder = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    faces = {"mono": "DejaVuSansMono.ttf", "bold": "DejaVuSansMono-Bold.ttf", "fallback": "DejaVuSans.ttf"}
    out: dict[str, object] = {name: ImageFont.truetype(str(folder / file), FONT_SIZE) for name, file in faces.items()}
    out["mono_chars"] = frozenset(TTFont(folder / faces["mono"]).getBestCmap())
    return out


def cell_size() -> tuple[int, int]:
    """Returns (width, height) of a cell in pixels: the monospace advance rounded up, ascent + descent."""
    font = _fonts()["mono"]
    ascent, descent = font.getmetrics()
    return int(-(-font.getlength("M") // 1)), ascent + descent


def _rgb(color, theme, foreground: bool) -> tuple[int, int, int]:
    if color is None:
        triplet = theme.foreground_color if foreground else theme.background_color
    else:
        triplet = color.get_truecolor(theme, foreground=foreground)
    return (int(triplet[0]), int(triplet[1]), int(triplet[2]))


def cells_of_lines(lines, theme=None) -> list[list[Cell]]:
    """Returns rows of Cells from rich segment lines (control segments left out)."""
    from rich.cells import cell_len
    from rich.terminal_theme import SVG_EXPORT_THEME

    theme = theme or SVG_EXPORT_THEME
    rows = []
    for line in lines:
        row: list[Cell] = []
        for segment in line:
            if segment.control:
                continue
            style = segment.style
            fg = _rgb(style.color if style else None, theme, True)
            bg = _rgb(style.bgcolor if style else None, theme, False)
            if style is not None and style.reverse:
                fg, bg = bg, fg
            if style is not None and style.dim:
                fg = tuple((f + b) // 2 for f, b in zip(fg, bg))
            bold = bool(style and style.bold)
            underline, strike = bool(style and style.underline), bool(style and style.strike)
            for char in segment.text:
                width = cell_len(char)
                if width == 0:
                    continue
                row.append(Cell(char, fg, bg, bold, underline, strike, width))
                if width == 2:
                    row.append(Cell("", fg, bg, bold, underline, strike, 0))
        rows.append(row)
    return rows


def _shade(fg, bg, amount: float) -> tuple[int, int, int]:
    return tuple(round(b + (f - b) * amount) for f, b in zip(fg, bg))


# U+2596-U+259F quadrants: which of (upper left, upper right, lower left, lower right) are filled
_QUADRANTS = {
    0x2596: "0010",
    0x2597: "0001",
    0x2598: "1000",
    0x2599: "1011",
    0x259A: "1001",
    0x259B: "1110",
    0x259C: "1101",
    0x259D: "0100",
    0x259E: "0110",
    0x259F: "0111",
}
# Braille: bit k of (code - 0x2800) is dot k + 1; dots 1-3 and 7 are the left column top to bottom, 4-6 and 8 the right
_BRAILLE_DOTS = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (0, 3), (1, 3)]


def _draw_shape(draw, code: int, x: int, y: int, w: int, h: int, fg, bg) -> bool:
    """Paints a block element, a Braille pattern or an underscore into the cell at (x, y); returns False for any
    other character."""
    if code == 0x5F:  # '_': the font's is one pixel on the cell's last row, lost against the next line; a terminal
        # draws it as a bar across the cell above its bottom edge, two pixels at this size
        bar = max(2, h // 9)
        draw.rectangle([x, y + h - 2 - bar, x + w - 1, y + h - 3], fill=fg)
        return True
    if 0x2800 <= code <= 0x28FF:
        bits = code - 0x2800
        dot = max(1, min(w // 4, h // 8))
        for k, (col, row) in enumerate(_BRAILLE_DOTS):
            if bits >> k & 1:
                cx = x + round((col * 2 + 1) * w / 4)
                cy = y + round((row * 2 + 1) * h / 8)
                draw.rectangle([cx - dot, cy - dot, cx + dot - 1, cy + dot - 1], fill=fg)
        return True
    if not 0x2580 <= code <= 0x259F:
        return False
    if code == 0x2580:  # upper half
        draw.rectangle([x, y, x + w - 1, y + h // 2 - 1], fill=fg)
    elif 0x2581 <= code <= 0x2588:  # lower one to eight eighths (the last: full block)
        top = y + h * (0x2588 - code) // 8  # the lower half starts where the upper half (above) ends
        draw.rectangle([x, top, x + w - 1, y + h - 1], fill=fg)
    elif 0x2589 <= code <= 0x258F:  # left seven eighths down to one eighth
        right = x + round(w * (0x2590 - code) / 8)
        draw.rectangle([x, y, right - 1, y + h - 1], fill=fg)
    elif code == 0x2590:  # right half
        draw.rectangle([x + w // 2, y, x + w - 1, y + h - 1], fill=fg)
    elif code in (0x2591, 0x2592, 0x2593):  # light, medium, dark shade: the colour a terminal's dither averages to
        draw.rectangle([x, y, x + w - 1, y + h - 1], fill=_shade(fg, bg, (code - 0x2590) / 4))
    elif code == 0x2594:  # upper one eighth
        draw.rectangle([x, y, x + w - 1, y + round(h / 8) - 1], fill=fg)
    elif code == 0x2595:  # right one eighth
        draw.rectangle([x + w - round(w / 8), y, x + w - 1, y + h - 1], fill=fg)
    else:
        for k, filled in enumerate(_QUADRANTS[code]):
            if filled == "1":
                left, top = x + (k % 2) * (w // 2), y + (k // 2) * (h // 2)
                draw.rectangle(
                    [left, top, (x + w if k % 2 else x + w // 2) - 1, (y + h if k // 2 else y + h // 2) - 1], fill=fg
                )
    return True


def render_cells(rows: list[list[Cell]], columns: int) -> bytes:
    """Returns the PNG bytes of rows of cells, `columns` cells wide (a short row is padded with the theme's
    background)."""
    from PIL import Image, ImageDraw
    from rich.terminal_theme import SVG_EXPORT_THEME

    fonts = _fonts()
    w, h = cell_size()
    background = tuple(SVG_EXPORT_THEME.background_color)
    image = Image.new("RGB", (columns * w, len(rows) * h), background)
    draw = ImageDraw.Draw(image)
    ascent = fonts["mono"].getmetrics()[0]
    for r, row in enumerate(rows):
        y, col = r * h, 0
        for cell in row:
            if col >= columns:
                break
            if cell.width == 0:  # the right half of a wide character: painted with it
                col += 1
                continue
            x, span = col * w, cell.width * w
            draw.rectangle([x, y, x + span - 1, y + h - 1], fill=cell.bg)
            char = cell.char
            if char.strip() and not _draw_shape(draw, ord(char), x, y, span, h, cell.fg, cell.bg):
                font = fonts["bold" if cell.bold else "mono"] if ord(char) in fonts["mono_chars"] else fonts["fallback"]
                draw.text((x, y + ascent), char, font=font, fill=cell.fg, anchor="ls")
            if cell.underline:
                draw.line([x, y + h - 2, x + span - 1, y + h - 2], fill=cell.fg)
            if cell.strike:
                draw.line([x, y + h // 2, x + span - 1, y + h // 2], fill=cell.fg)
            col += cell.width
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


def screen_png(app) -> bytes:
    """Returns the PNG of the running app's current screen, rendered as Textual renders its SVG screenshot."""
    from rich.console import Console
    from rich.segment import Segment

    width, height = app.size
    console = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        force_terminal=True,
        color_system="truecolor",
        legacy_windows=False,
        safe_box=False,
    )
    update = app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)
    segments = Segment.filter_control(console.render(update, console.options))
    lines = list(Segment.split_and_crop_lines(segments, width, pad=True))[:height]
    return render_cells(cells_of_lines(lines), width)
