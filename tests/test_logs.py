"""The app's log: a file under $XDG_STATE_HOME/vitsee/, which the one line of a bug it survives names, holding the
traceback."""

from __future__ import annotations

import logging
from pathlib import Path

from helpers.app import SIZE, make_app, notifications, settle
from vitsee.tui.logs import bug_text, log_path, setup_logging


def test_the_log_file_is_under_xdg_state_home_or_the_home_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert log_path() == tmp_path / "state" / "vitsee" / "vitsee-tui.log"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert log_path() == tmp_path / "home" / ".local" / "state" / "vitsee" / "vitsee-tui.log"


def test_setting_up_twice_logs_once_and_a_new_state_home_moves_the_file(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "a"))
    first = setup_logging()
    setup_logging()
    logging.getLogger("vitsee.tests").warning("one line")
    assert first.read_text().count("one line") == 1
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "b"))
    second = setup_logging()
    logging.getLogger("vitsee.tests").warning("another")
    assert second != first and "another" in second.read_text() and "another" not in first.read_text()


async def test_a_bug_while_loading_a_view_says_in_one_line_which_file_holds_its_traceback(store, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    def broken(*args, **kwargs):
        raise RuntimeError("boom in the view")

    monkeypatch.setattr("vitsee.tui.widgets.view_panes.read_view", broken)  # what the panes read views with
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        errors = [m for m, severity in notifications(app) if severity == "error"]
        path = tmp_path / "state" / "vitsee" / "vitsee-tui.log"
        assert app.log_file == path
        assert any(m.startswith("cannot show cka:") and f"the traceback is in {path}" in m for m in errors), errors
    text = Path(path).read_text()
    assert "Traceback (most recent call last)" in text and "RuntimeError: boom in the view" in text


def test_the_bug_line_names_what_failed_the_error_and_the_file():
    line = bug_text("export failed", ValueError("bad\nsecond line"))
    assert line == f"export failed: ValueError: bad (a bug: the traceback is in {log_path()})"
