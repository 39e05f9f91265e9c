"""Settings: config.toml under the flags, key remaps by Binding id and the vim preset, --show-config, and the
headless --snapshot of a view."""

from __future__ import annotations

import html
import re
import shutil
from pathlib import Path

import pytest

from conftest import RESNET, VIT
from helpers.app import SIZE, analysed_copy, settle, view_shown
from vitsee.output.colormap import ColorMode
from vitsee.errors import VitseeError
from vitsee.store import copy_store
from vitsee.analyses.views import load_view
from vitsee.tui.app import build_app, main, parse_args
from vitsee.tui.config import PRESETS, binding_table, config_path, load_settings
from vitsee.tui.widgets.heatmap import Heatmap


@pytest.fixture(scope="module")
def store(tiny_store, tmp_path_factory) -> Path:
    return analysed_copy(tiny_store, tmp_path_factory.getbasetemp())


@pytest.fixture(autouse=True)
def no_user_config(tmp_path, monkeypatch):
    """Every test reads its own config folder, never the user's."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("VITSEE_COLOR", raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)


def write_config(tmp_path: Path, text: str) -> Path:
    path = config_path()
    assert path == tmp_path / "xdg" / "vitsee" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def run_main(args: list, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    out = capsys.readouterr()
    return exit_info.value.code, out.out, out.err


# --- settings and where they come from --------------------------------------------------------------------


def test_the_file_sets_what_it_names_flags_override_it_and_the_rest_stays_default(tmp_path):
    path = write_config(
        tmp_path, 'colormap = "magma"\ncolor = "256"\nmouse = false\nexport_dir = "~/figs"\ndevice = "cuda:1"\n'
    )
    settings = load_settings()
    assert settings["colormap"] == "magma" and settings.values["colormap"].source == str(path)
    assert settings["mouse"] is False and settings["export_dir"] == Path.home() / "figs"
    assert settings.color_mode() is ColorMode.COLORS_256 and settings["device"] == "cuda:1"
    assert settings.values["preset"].source == "default" and settings.keymap() == {}

    args = parse_args(["--cmap", "cividis", "--no-mouse", "--color", "none", "--export-dir", "out"])
    app = build_app(args)
    assert (app.options.cmap, app.options.color_mode, app.options.export_dir) == (
        "cividis",
        ColorMode.NONE,
        Path("out"),
    )
    assert app.options.device == "cuda:1"  # not given as a flag: the file's
    flagged = load_settings({"colormap": "cividis", "mouse": False})
    assert flagged.values["colormap"].source == "flag --cmap" and flagged.values["mouse"].source == "flag --no-mouse"
    assert flagged.values["device"].source == str(path)


@pytest.mark.parametrize("where", ["file", "flag"])
def test_an_export_dir_that_is_a_file_is_refused_at_start_not_at_the_first_export(tmp_path, where):
    blocker = tmp_path / "figs"
    blocker.write_text("a file\n")
    if where == "file":
        write_config(tmp_path, f'export_dir = "{blocker / "png"}"\n')
    with pytest.raises(VitseeError) as error:
        load_settings({"export_dir": str(blocker)} if where == "flag" else None)
    text = str(error.value)
    assert f"{blocker} is a file, not a folder" in text and "\n" not in text
    assert text.startswith(f"--export-dir {blocker}:") if where == "flag" else "export_dir = " in text
    if where == "file":
        write_config(tmp_path, "")
    assert load_settings({"export_dir": str(tmp_path / "new" / "png")})["export_dir"] == tmp_path / "new" / "png"


def test_without_a_file_every_setting_is_its_default(tmp_path):
    settings = load_settings()
    assert not settings.found
    assert {n: v.source for n, v in settings.values.items()} == dict.fromkeys(settings.values, "default")
    assert (settings["colormap"], settings["color"], settings["mouse"], settings["device"]) == (
        "viridis",
        "auto",
        True,
        "auto",
    )


def test_vitsee_color_beats_the_file_and_a_flag_beats_both(tmp_path, monkeypatch):
    write_config(tmp_path, 'color = "256"\n')
    monkeypatch.setenv("VITSEE_COLOR", "none")
    settings = load_settings()
    assert settings.color_mode() is ColorMode.NONE and settings.values["color"].source == "env VITSEE_COLOR"
    assert load_settings({"color": "truecolor"}).color_mode() is ColorMode.TRUECOLOR
    monkeypatch.delenv("VITSEE_COLOR")
    monkeypatch.setenv("NO_COLOR", "1")  # no-color.org: a config file overrides NO_COLOR
    assert load_settings().color_mode() is ColorMode.COLORS_256


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            'colormap = "magma"\ncolour = "256"\n',
            r"unknown setting 'colour' \(did you mean 'color'\?\): the settings are ",
        ),
        ('colormap = "plasma"\n', r"colormap = 'plasma' is not valid: choose one of viridis, magma, cividis"),
        ('mouse = "no"\n', r"mouse = 'no' is not valid: write true or false"),
        ('device = "gpu"\n', r"device = 'gpu' is not valid: use auto, cpu, cuda or cuda:N"),
        ('preset = "emacs"\n', r"preset = 'emacs' is not valid: choose vim \(or none\)"),
        ("colormap = magma\n", r"not valid TOML \(.*line 1.*\): fix the file or move it away"),
        (
            '[keys]\n"explorer.exprot" = "E"\n',
            r"unknown binding id 'explorer.exprot' \(did you mean 'explorer.export'\?\): "
            r"fix or remove it",
        ),
        ('[keys]\n"explorer.export" = "ctrl+"\n', r"\[keys\] 'explorer.export' = 'ctrl\+': 'ctrl\+' is not a key"),
        ('[keys]\n"explorer.export" = 5\n', r"\[keys\] 'explorer.export' = 5: give the keys as a string"),
        (
            '[keys]\n"heatmap.up" = "z"\n',
            r"\[keys\] 'heatmap.up' = 'z' takes 'z', which 'heatmap.zoom' already uses in "
            r"Heatmap: pick another key, or remap 'heatmap.zoom' too",
        ),
        (
            'preset = "vim"\n[keys]\n"heatmap.zoom" = "G"\n',
            r"'heatmap.zoom' = 'G' takes 'G', which 'heatmap.last_row' "
            r"\(preset vim\) already uses in Heatmap",
        ),
    ],
)
def test_a_bad_file_is_one_line_naming_the_file_the_key_and_the_way_out(tmp_path, capsys, text, expected):
    path = write_config(tmp_path, text)
    with pytest.raises(VitseeError) as error:
        load_settings()
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    assert re.search(expected, message), message
    code, out, err = run_main([], capsys)  # the app does not start
    assert code == 2 and out == "" and err == f"error: {message}\n"


def test_a_bad_flag_value_names_the_flag(tmp_path, capsys):
    code, _, err = run_main(["--device", "gpu"], capsys)
    assert code == 2 and err == "error: --device gpu: use auto, cpu, cuda or cuda:N\n"


def test_the_vim_preset_and_the_remaps_name_only_real_bindings_and_clash_with_none():
    table = binding_table()
    ids = {i for owner in table.values() for i in owner}
    for cursor in (
        "heatmap.up",
        "heatmap.down",
        "heatmap.left",
        "heatmap.right",
        "attention.up",
        "heads.left",
        "probes.up",
        "probes.right",
    ):
        assert cursor in ids
    assert set(PRESETS["vim"]) <= ids
    assert table["vitsee.tui.widgets.heatmap.Heatmap"]["heatmap.first_row"] == "home"


# --- --show-config ------------------------------------------------------------------------------------------


def test_show_config_prints_each_setting_its_value_and_source_and_the_keymap(tmp_path, capsys):
    path = write_config(
        tmp_path, 'colormap = "magma"\npreset = "vim"\n[keys]\n"explorer.export" = "E,ctrl+e"\n"app.help" = "?,f1"\n'
    )
    code, out, err = run_main(["--show-config", "--no-mouse", "--color", "16"], capsys)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == f"config file: {path}"
    rows = {line.split()[0]: line.split() for line in lines if line and not line.startswith(" ")}
    assert rows["colormap"] == ["colormap", "magma", str(path)]
    assert rows["color"] == ["color", "16", "flag", "--color"]
    assert rows["mouse"] == ["mouse", "false", "flag", "--no-mouse"]
    assert rows["device"] == ["device", "auto", "default"] and rows["preset"] == ["preset", "vim", str(path)]
    remaps = {line.split()[0]: line.split()[1:] for line in lines if line.startswith("  ")}
    assert remaps["explorer.export"] == ["E,ctrl+e", str(path)]
    assert remaps["app.help"] == ["question_mark,f1", str(path)]  # as Textual names the key
    assert remaps["heatmap.last_row"] == ["end,G", "preset", "vim"]
    assert len(remaps) == 1 + len(PRESETS["vim"]) + 2  # the header, the preset, and the file's two


def test_show_config_without_a_file_says_so(tmp_path, capsys):
    code, out, _ = run_main(["--show-config"], capsys)
    assert code == 0 and "(not found: defaults and flags only)" in out.splitlines()[0]
    assert "keymap overrides: none" in out


# --- keymaps in the app ----------------------------------------------------------------------------------------


def app_with_config(store: Path, tmp_path: Path, text: str):
    write_config(tmp_path, text)
    return build_app(parse_args([str(store), "--export-dir", str(tmp_path / "exports")]))


async def test_a_remapped_key_moves_the_cursor_and_the_old_keys_no_longer_do(store, tmp_path):
    app = app_with_config(store, tmp_path, '[keys]\n"heatmap.right" = "w"\n')
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        heatmap = app.screen.query_one(Heatmap)
        assert heatmap.cursor == (0, 0)
        await pilot.press("right", "l")
        assert heatmap.cursor == (0, 0)
        await pilot.press("w", "w")
        assert heatmap.cursor == (0, 2)
        await pilot.press("h")  # the other bindings keep their keys
        assert heatmap.cursor == (0, 1)


async def test_the_vim_preset_jumps_with_g_G_0_dollar_and_pages_with_ctrl_d_u(store, tmp_path):
    app = app_with_config(store, tmp_path, 'preset = "vim"\n')
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        heatmap = app.screen.query_one(Heatmap)
        view = app.screen.pane("cka").view
        last_row, last_col = len(view.rows) - 1, len(view.cols) - 1
        await pilot.press("G")
        assert heatmap.cursor == (last_row, 0)
        await pilot.press("dollar_sign")
        assert heatmap.cursor == (last_row, last_col)
        await pilot.press("g", "0")
        assert heatmap.cursor == (0, 0)
        await pilot.press("ctrl+d")
        assert heatmap.cursor[0] > 0
        await pilot.press("ctrl+u")
        assert heatmap.cursor == (0, 0)
        await pilot.press("3")  # the probe table: hjkl too
        await settle(pilot, view_shown("probes"))
        table = app.screen.query_one("#probes-table")
        await pilot.press("j", "j", "l")
        assert tuple(table.cursor_coordinate) == (2, 1)


async def test_without_the_preset_G_does_not_move_the_cursor(store, tmp_path):
    app = app_with_config(store, tmp_path, 'colormap = "magma"\n')
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        heatmap = app.screen.query_one(Heatmap)
        assert heatmap.cmap == "magma"
        await pilot.press("G", "dollar_sign")
        assert heatmap.cursor == (0, 0)


# --- --snapshot -------------------------------------------------------------------------------------------------


def svg_lines(path: Path) -> list[str]:
    """Returns the text runs of a Textual SVG screenshot, as the screen showed them."""
    runs = re.findall(r"<text[^>]*>(.*?)</text>", path.read_text())
    return [html.unescape(run).replace("\xa0", " ") for run in runs]


def test_snapshot_of_a_kind_writes_the_apps_default_view_with_its_title_and_labels(store, tmp_path, capsys):
    out = tmp_path / "shots" / "cka.svg"
    out.parent.mkdir()  # a missing folder is refused, as export refuses it
    code, stdout, err = run_main([store, "--snapshot", "cka", "--out", out, "--size", "100x30"], capsys)
    assert code == 0, err
    view = load_view(store, f"cka:{VIT}:{RESNET}")
    assert stdout == f"wrote {out} ({view.spec} at 100x30)\n"
    text = "\n".join(svg_lines(out))
    assert view.title in text  # the cross-model matrix the app opens on
    for label in ("patch_embed", "blocks.5", "maxpool", "l4.0"):
        assert label in text
    assert "loading" not in text and "computing" not in text
    assert 'viewBox="0 0' in out.read_text()


def test_snapshot_of_a_view_string_names_its_models_and_layer(store, tmp_path, capsys):
    # blocks.2's spatial map is not cached: the snapshot computes and caches it, so it works on a copy (other
    # tests count on the shared store caching the last blocks' maps only)
    store = copy_store(store, tmp_path / "copy.h5")
    out = tmp_path / "spatial.svg"
    code, _, err = run_main([store, "--snapshot", "spatial:test_vit:blocks.2", "--out", out], capsys)
    assert code == 0, err
    text = "\n".join(svg_lines(out))
    assert load_view(store, f"spatial:{VIT}:blocks.2").title in text
    out = tmp_path / "within.svg"
    code, _, err = run_main([store, "--snapshot", "cka:test_vit", "--out", out], capsys)
    assert code == 0, err
    text = "\n".join(svg_lines(out))
    assert load_view(store, f"cka:{VIT}").title in text and "same as A" in text and "maxpool" not in text


def test_snapshot_of_a_view_not_cached_computes_it_first(tiny_store, tmp_path, capsys):
    fresh = tmp_path / "fresh.h5"
    shutil.copy(tiny_store, fresh)
    out = tmp_path / "skip.svg"
    code, _, err = run_main([fresh, "--snapshot", f"skip:{VIT}", "--out", out, "--size", "110x30"], capsys)
    assert code == 0, err
    text = "\n".join(svg_lines(out))
    assert load_view(fresh, f"skip:{VIT}").title in text and "blocks.0" in text
    assert "not in the store's cache" not in text


@pytest.mark.parametrize(
    "view, expected",
    [
        (
            "bogus",
            "error: --snapshot bogus: unknown view: give a kind (cka, rbf_cka, procrustes, svcca, pwcca, mknn, cknna, "
            "rsa, soft_matching, linear_predictivity, agree, attention, probes, skip, spatial, heads, erf, zoo, "
            "separability, curve) or a view such as cka:MODEL_A:MODEL_B",
        ),
        ("cka:nomodel", "error: no model 'nomodel' in "),
        (
            f"attention:{RESNET}",
            f"error: STORE: cannot show attention:{RESNET}: {RESNET} has no attention distances "
            "(resnet model): they exist for ViT- and Swin-like models only",
        ),
    ],
)
def test_a_snapshot_of_a_bad_view_is_one_line_and_exit_2(store, tmp_path, capsys, view, expected):
    out = tmp_path / "x.svg"
    code, stdout, err = run_main([store, "--snapshot", view, "--out", out], capsys)
    assert code == 2 and stdout == "" and err.count("\n") == 1
    assert err.startswith(expected.replace("STORE", str(store))), err
    assert not out.exists()


def test_a_snapshot_of_a_missing_store_or_without_out_is_one_line_and_exit_2(tmp_path, capsys):
    code, _, err = run_main([tmp_path / "nope.h5", "--snapshot", "cka", "--out", tmp_path / "x.svg"], capsys)
    assert code == 2 and "nope.h5 does not exist" in err and err.count("\n") == 1
    code, _, err = run_main([tmp_path / "nope.h5", "--snapshot", "cka"], capsys)
    assert code == 2 and err == "error: --snapshot needs --out FILE.svg (or FILE.png): where to write the screenshot\n"
    code, _, err = run_main([tmp_path / "nope.h5", "--size", "80x24"], capsys)
    assert code == 2 and err.startswith("error: --size goes with --snapshot VIEW")


@pytest.mark.parametrize(
    "size, out, expected",
    [
        ("100000x100000", "x.svg", "--size 100000x100000: a snapshot is at most 1000x1000"),
        ("1001x40", "x.svg", "--size 1001x40: a snapshot is at most 1000x1000"),
        ("120x40", "shots.svg", "--out TMP/shots.svg is a folder: name the file to write"),
        ("120x40", "notes/x.svg", "--out TMP/notes/x.svg: TMP/notes is a file, not a folder"),
    ],
)
def test_a_snapshot_too_large_or_onto_a_folder_is_refused_in_one_line_before_the_app_starts(
    store, tmp_path, capsys, size, out, expected
):
    (tmp_path / "shots.svg").mkdir()
    (tmp_path / "notes").write_text("a file\n")
    code, stdout, err = run_main([store, "--snapshot", "cka", "--out", tmp_path / out, "--size", size], capsys)
    assert code == 2 and stdout == "" and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("error: " + expected.replace("TMP", str(tmp_path))), err
    assert list((tmp_path / "shots.svg").iterdir()) == [] and not (tmp_path / "x.svg").exists()


# --- the README's Settings section ---------------------------------------------------------------------------------


def readme_settings() -> str:
    text = (Path(__file__).parent.parent / "README.md").read_text()
    return text[text.index("### Settings") : text.index("## The command line")]


def test_the_readmes_example_file_is_valid_and_means_what_it_says(tmp_path):
    section = readme_settings()
    example = section[section.index("```toml") + len("```toml") : section.index("```", section.index("```toml") + 7)]
    write_config(tmp_path, example)
    settings = load_settings()
    assert (settings["colormap"], settings["color"], settings["mouse"], settings["preset"]) == (
        "magma",
        "256",
        False,
        "vim",
    )
    assert settings.keymap()["explorer.export"] == "E,ctrl+e"


def test_the_readme_lists_every_binding_id():
    section = re.sub(r"\s+", " ", readme_settings())
    listed = set()
    for prefix, names in re.findall(r"`(\w+)\.` ([a-z_ ]+?)(?:;|\.)", section):
        listed |= {f"{prefix}.{name}" for name in names.split()}
    listed |= set(re.findall(r"`(\w+\.\w+)`", section))
    ids = {i for owner in binding_table().values() for i in owner if not i.startswith("\x00")}
    assert ids <= listed, sorted(ids - listed)
