"""The app's settings: defaults, then `$XDG_CONFIG_HOME/vitsee/config.toml`, then the command line; and key remaps.

    # ~/.config/vitsee/config.toml
    colormap = "magma"          # viridis | magma | cividis
    color = "256"               # auto | truecolor | 256 | 16 | none
    mouse = false
    export_dir = "~/vitsee-exports"
    device = "cuda:0"           # auto | cpu | cuda | cuda:N
    preset = "vim"              # extra vim keys (PRESETS below)
    export_marks = true         # `e` marks the cursor's cell in the exported figure (default false)

    [keys]                      # Binding id = comma-separated keys; replaces that binding's keys
    "explorer.export" = "E,ctrl+e"

Each value remembers where it came from, so `vitsee-tui --show-config` can say it. Anything the file gets wrong
is a VitseeError naming the file, the key and the way out: the app does not start on a setting it misread.
"""

from __future__ import annotations

import difflib
import importlib
import os
import pkgutil
import re
import tomllib
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from vitsee.output.colormap import ColorMode, detect_color_mode
from vitsee.errors import VitseeError
from vitsee.tui.options import COLORMAPS, AppOptions

DEFAULT = "default"
COLOR_CHOICES = ("auto", "truecolor", "256", "16", "none")
DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?$")

# What `preset = "vim"` adds, by Binding id. hjkl already move every cursor; this adds vim's jumps and pages,
# and hjkl in the probe table (`:` is already the explorer's jump overlay, vim's command line). The ERF log toggle
# leaves `g` (first row) to the heatmap it sits around, which would otherwise hide it.
PRESETS: dict[str, dict[str, str]] = {
    "vim": {
        "heatmap.first_row": "home,g",
        "heatmap.last_row": "end,G",
        "heatmap.first_col": "shift+home,0",
        "heatmap.last_col": "shift+end,dollar_sign",
        "heatmap.page_up": "pageup,ctrl+u",
        "heatmap.page_down": "pagedown,ctrl+d",
        "attention.first": "home,g",
        "attention.last": "end,G",
        "probes.up": "up,k",
        "probes.down": "down,j",
        "probes.left": "left,h",
        "probes.right": "right,l",
        "erf.log": "L",
    },
}


@dataclass(frozen=True)
class Setting:
    """One setting of the file: its default, the flag that overrides it, and how its value is checked."""

    default: Any
    flag: str
    check: Callable[[Any], Any]  # returns the value to use, or raises ValueError with the way out


def _choice(choices: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or value.lower() not in choices:
            raise ValueError(f"choose one of {', '.join(choices)}")
        return value.lower()

    return check


def _color(value: Any) -> str:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:  # the aliases --color and VITSEE_COLOR take: 24bit, 8bit, ansi, never ...
        return ColorMode.parse(value if isinstance(value, str) else repr(value)).value
    except VitseeError:
        raise ValueError(f"choose one of {', '.join(COLOR_CHOICES)}") from None


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("write true or false (no quotes)")
    return value


def _folder(value: Any) -> Path:
    if not isinstance(value, (str, Path)) or not str(value).strip():
        raise ValueError('give a folder as a string, such as "~/vitsee-exports"')
    path = Path(value).expanduser()
    # made on the first export if missing; a file in the way would fail only then, after the view was drawn
    blocking = next((p for p in [path, *path.parents] if p.exists()), None)
    if blocking is not None and not blocking.is_dir():
        raise ValueError(f"{blocking} is a file, not a folder: give a folder to export into (made if missing)")
    return path


def _device(value: Any) -> str:
    if not isinstance(value, str) or not DEVICE.fullmatch(value.strip().lower()):
        raise ValueError("use auto, cpu, cuda or cuda:N")
    return value.strip().lower()


def _preset(value: Any) -> str:
    if value not in ("none", *PRESETS):
        raise ValueError(f"choose {' or '.join(PRESETS)} (or none)")
    return value


SETTINGS: dict[str, Setting] = {
    "colormap": Setting("viridis", "--cmap", _choice(COLORMAPS)),
    "color": Setting("auto", "--color", _color),
    "mouse": Setting(True, "--no-mouse", _boolean),
    "export_dir": Setting(Path("vitsee-exports"), "--export-dir", _folder),
    "device": Setting("auto", "--device", _device),
    "preset": Setting("none", "", _preset),
    # `e` draws the cursor's cell into the exported figure (a box and its value): off, so an export is a paper's
    # figure as it is; on, for a figure that points at one pair
    "export_marks": Setting(False, "", _boolean),
}


@dataclass
class Value:
    """A setting's value and where it came from: 'default', the config file's path, or 'flag --x'."""

    value: Any
    source: str


@dataclass
class Settings:
    """Every setting with its source, and the keymap overrides (binding id -> (keys, source))."""

    path: Path
    found: bool
    values: dict[str, Value]
    keys: dict[str, Value] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        return self.values[name].value

    def color_mode(self, env: Mapping[str, str] | None = None) -> ColorMode:
        """Returns the heatmaps' colour mode: the setting, or for auto what the terminal can show."""
        color = self["color"]
        return detect_color_mode(env) if color == "auto" else ColorMode.parse(color)

    def options(self, env: Mapping[str, str] | None = None) -> AppOptions:
        """Returns the options every screen reads."""
        return AppOptions(
            color_mode=self.color_mode(env),
            export_dir=self["export_dir"],
            cmap=self["colormap"],
            device=self["device"],
            export_marks=self["export_marks"],
        )

    def keymap(self) -> dict[str, str]:
        """Returns the keymap for App.set_keymap: binding id -> comma-separated keys."""
        return {binding_id: value.value for binding_id, value in self.keys.items()}

    def describe(self, env: Mapping[str, str] | None = None) -> str:
        """Returns the text of --show-config: the file, each setting with its value and source, the keymap."""
        lines = [f"config file: {self.path}" + ("" if self.found else " (not found: defaults and flags only)"), ""]
        rows = []
        for name, value in self.values.items():
            shown = _show(value.value)
            if name == "color" and value.value == "auto":
                shown += f" ({self.color_mode(env).value} here)"
            rows.append((name, shown, value.source))
        lines += _table(("setting", "value", "from"), rows)
        lines.append("")
        if self.keys:
            lines.append("keymap overrides:")
            lines += _table(
                ("binding id", "keys", "from"),
                [(i, v.value, v.source) for i, v in sorted(self.keys.items())],
                indent="  ",
            )
        else:
            lines.append("keymap overrides: none (every key as shipped; ? in the app lists them)")
        return "\n".join(lines)


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]], indent: str = "") -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    return [indent + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)) + "  " + r[-1] for r in [header, *rows]]


# --- the file -------------------------------------------------------------------------------------------------


def config_path(env: Mapping[str, str] | None = None) -> Path:
    """Returns where the config file is looked for: $XDG_CONFIG_HOME/vitsee/config.toml, else ~/.config/..."""
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME", "")
    # the XDG spec: an empty or relative XDG_CONFIG_HOME is to be ignored
    root = Path(base) if base and os.path.isabs(base) else Path(env.get("HOME") or Path.home()) / ".config"
    return root / "vitsee" / "config.toml"


def read_file(path: Path) -> dict[str, Any] | None:
    """Returns the parsed TOML of the config file, or None when there is none."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise VitseeError(
            f"{path}: cannot read the config file ({exc.strerror}): fix its permissions or move it away"
        ) from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise VitseeError(
            f"{path}: not valid TOML ({exc}): fix the file or move it away "
            "(an example is in the README's Settings section)"
        ) from None


def _unknown(path: Path, what: str, name: str, known: list[str], way_out: str) -> VitseeError:
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return VitseeError(f"{path}: unknown {what} '{name}'{hint}: {way_out}")


def load_settings(
    flags: Mapping[str, Any] | None = None, path: Path | None = None, env: Mapping[str, str] | None = None
) -> Settings:
    """Returns the settings: each flag given (not None) over the file's value over the default.

    `flags` maps setting names to what the command line gave (None: not given); `path` is the config file
    (default config_path(env)). A bad file, setting, value or binding id raises VitseeError.
    """
    path = Path(path) if path is not None else config_path(env)
    data = read_file(path)
    found = data is not None
    data = dict(data or {})
    key_table = data.pop("keys", {})
    values: dict[str, Value] = {}
    for name in data:
        if name not in SETTINGS:
            raise _unknown(
                path,
                "setting",
                name,
                [*SETTINGS, "keys"],
                f"the settings are {', '.join(SETTINGS)} and a [keys] table; rename or remove it",
            )
    for name, setting in SETTINGS.items():
        values[name] = Value(setting.default, DEFAULT)
        if name in data:
            try:
                values[name] = Value(setting.check(data[name]), str(path))
            except ValueError as exc:
                raise VitseeError(f"{path}: {name} = {data[name]!r} is not valid: {exc}") from None
        if name == "color" and (env if env is not None else os.environ).get("VITSEE_COLOR"):
            given_env = (env if env is not None else os.environ)["VITSEE_COLOR"]
            try:  # the environment is closer to this terminal than the file is
                values[name] = Value(setting.check(given_env), "env VITSEE_COLOR")
            except ValueError as exc:
                raise VitseeError(f"VITSEE_COLOR={given_env}: {exc}") from None
        given = (flags or {}).get(name)
        if given is not None:
            try:
                values[name] = Value(setting.check(given), f"flag {setting.flag}")
            except ValueError as exc:
                raise VitseeError(f"{setting.flag} {given}: {exc}") from None
    settings = Settings(path, found, values)
    if not isinstance(key_table, dict):
        raise VitseeError(f'{path}: keys must be a table ([keys], then lines like "explorer.export" = "E")')
    preset = values["preset"].value
    if preset in PRESETS:
        settings.keys = {i: Value(k, f"preset {preset}") for i, k in PRESETS[preset].items()}
    settings.keys.update({i: Value(_key_list(path, i, k), str(path)) for i, k in key_table.items()})
    check_keymap(path, settings.keys)
    return settings


# --- keys -----------------------------------------------------------------------------------------------------

MODIFIERS = ("ctrl", "shift", "alt", "meta", "super", "hyper")
NAMED_KEYS = {
    "up",
    "down",
    "left",
    "right",
    "home",
    "end",
    "pageup",
    "pagedown",
    "insert",
    "delete",
    "backspace",
    "tab",
    "enter",
    "escape",
    "space",
    *(f"f{n}" for n in range(1, 25)),
}


def key_name_ok(key: str) -> bool:
    """Returns whether Textual can bind `key`: [modifier+]... then a character, a key name or a character name."""
    *mods, base = key.split("+")
    if any(m not in MODIFIERS for m in mods) or not base:
        return False
    if len(base) == 1 or base in NAMED_KEYS:
        return True
    from textual.keys import KEY_NAME_REPLACEMENTS, KEY_TO_UNICODE_NAME

    original = {v: k for k, v in KEY_NAME_REPLACEMENTS.items()}.get(base, base)
    try:  # a character by its name, as Textual spells it: question_mark, dollar_sign, slash, colon
        unicodedata.lookup(KEY_TO_UNICODE_NAME.get(original, original.replace("_", " ")))
    except KeyError:
        return False
    return True


def _key_list(path: Path, binding_id: str, keys: Any) -> str:
    """Returns the comma-separated keys of a [keys] entry (a string, or a list of strings)."""
    if isinstance(keys, list) and all(isinstance(k, str) for k in keys):
        keys = ",".join(keys)
    if not isinstance(keys, str):
        raise VitseeError(f"{path}: [keys] '{binding_id}' = {keys!r}: give the keys as a string, such as \"E,ctrl+e\"")
    from textual.keys import _character_to_key

    parts = [k.strip() for k in keys.split(",")]
    for key in parts:
        if not key_name_ok(key):
            raise VitseeError(
                f"{path}: [keys] '{binding_id}' = {keys!r}: '{key}' is not a key: use names such as "
                "e, E, ctrl+e, f5, pageup, question_mark"
            )
    return ",".join(_character_to_key(k) if len(k) == 1 else k for k in parts)  # '?' -> question_mark


def binding_table() -> dict[str, dict[str, str]]:
    """Returns, per class of the app that has bindings, its bindings' id -> default keys (ids only)."""
    import vitsee.tui as tui

    for module in pkgutil.walk_packages(tui.__path__, "vitsee.tui."):
        importlib.import_module(module.name)
    from textual.dom import DOMNode

    table: dict[str, dict[str, str]] = {}
    for cls in _subclasses(DOMNode):
        if not cls.__module__.startswith("vitsee.tui.") or cls._merged_bindings is None:
            continue
        ids: dict[str, list[str]] = {}
        for key, bindings in cls._merged_bindings.key_to_bindings.items():
            for binding in bindings:
                ids.setdefault(binding.id or f"\x00{binding.action}", []).append(key)
        if ids:
            table[f"{cls.__module__}.{cls.__qualname__}"] = {i: ",".join(k) for i, k in ids.items()}
    return table


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


def check_keymap(path: Path, keys: Mapping[str, Value]) -> None:
    """Raises VitseeError for an unknown binding id, or for two bindings of one widget left on the same key."""
    table = binding_table()
    known = sorted({i for ids in table.values() for i in ids if not i.startswith("\x00")})
    for binding_id in keys:
        if binding_id not in known:
            raise _unknown(
                path, "binding id", binding_id, known, "fix or remove it (the README's Settings section lists the ids)"
            )
    for owner, ids in table.items():
        taken: dict[str, str] = {}
        for binding_id, default in ids.items():
            remapped = binding_id in keys
            for key in (keys[binding_id].value if remapped else default).split(","):
                other = taken.get(key)
                if other is not None and (remapped or other in keys):
                    mine, theirs = (binding_id, other) if remapped else (other, binding_id)
                    if theirs in keys and keys[theirs].source == str(path):  # blame the file's line first
                        mine, theirs = theirs, mine
                    raise VitseeError(
                        f"{path}: [keys] '{mine}' = '{keys[mine].value}'{_via(path, keys, mine)} takes '{key}', "
                        f"which {_name(theirs)}{_via(path, keys, theirs)} already uses in "
                        f"{owner.rpartition('.')[2]}: pick another key, or remap {_name(theirs)} too"
                    )
                taken[key] = binding_id


def _via(path: Path, keys: Mapping[str, Value], binding_id: str) -> str:
    """Returns ' (preset vim)' for a remap the file did not make itself ('' otherwise)."""
    source = keys[binding_id].source if binding_id in keys else str(path)
    return "" if source == str(path) else f" ({source})"


def _name(binding_id: str) -> str:
    return f"the {binding_id[1:]} action" if binding_id.startswith("\x00") else f"'{binding_id}'"
