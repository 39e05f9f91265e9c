"""The app resumes a stopped run as `vitsee extract STORE` does: r on the cancelled run screen, R on the start
screen's unfinished store or on an incomplete store's explorer; Esc leaves a stopped run."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from conftest import IMG, VIT
from helpers.app import SIZE, make_app, notifications, settle, view_shown
from vitsee import threads
from vitsee.analyses.driver import AnalyzeConfig
from vitsee.extraction.extract import ExtractConfig, run_extraction
from vitsee.store import Store
from vitsee.tui.screens.run import RunPlan, RunScreen
from vitsee.tui.screens.start import StartScreen

RUN = dict(models=[VIT], dataset="synthetic", n_images=96, batch_size=2, img_size=IMG, device="cpu", workers=0)


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """The app's runs and the reference compute with one thread, so their values match bit for bit."""
    import torch

    monkeypatch.setattr(threads, "compute_threads", lambda requested=None: 1)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _activations(path) -> dict[str, np.ndarray]:
    with Store.open(path) as s:
        return {layer: s.activations(VIT, layer) for layer in s.layers(VIT)} | {"input": s.model_input(VIT)}


def _reference(tmp_path) -> dict[str, np.ndarray]:
    path = tmp_path / "straight.h5"
    run_extraction(ExtractConfig(store=path, **RUN))
    return _activations(path)


async def _start_and_stop(pilot, app, path, events, key: str) -> RunScreen:
    """Starts a run into path from the start screen and stops it with key once a batch is written."""
    screen = RunScreen(
        app.options,
        lambda: RunPlan(ExtractConfig(store=path, **RUN), AnalyzeConfig(device="cpu")),
        f"Extracting into {path}",
    )
    app.push_screen(screen)
    await settle(pilot, lambda a: any(e.stage == "extract" and e.done > 0 for e in events), timeout=60, idle=False)
    assert screen.check_action("cancel", ()) and not screen.check_action("resume", ())
    await pilot.press(key)
    await settle(pilot, lambda a: not screen.running, timeout=60, idle=False)
    assert "cancelled: finished batches are kept" in str(screen.query_one("#run-stage").render())
    assert (
        screen.check_action("resume", ()) and screen.check_action("leave", ()) and not screen.check_action("cancel", ())
    )
    with Store.open(path) as s:
        assert 0 < s.rows_done(VIT) < 96
    return screen


def _run_events(events):
    return lambda m: events.append(m) if type(m).__name__ == "RunEvent" else None


async def test_r_on_a_cancelled_run_resumes_it_to_the_values_of_an_uninterrupted_run(tmp_path):
    path = tmp_path / "run.h5"
    app = make_app(None, tmp_path)
    events: list = []
    async with app.run_test(size=SIZE, message_hook=_run_events(events)) as pilot:
        await settle(pilot)
        await _start_and_stop(pilot, app, path, events, "x")
        events.clear()
        await pilot.press("r")
        await settle(pilot, view_shown("cka"), timeout=90, idle=False)
        resumed = [e.text for e in events if e.stage == "plan" and e.text.startswith("resuming")]
        assert resumed and resumed[0].startswith(f"resuming {path}: {VIT} (")
        assert app.screen.path == path and len(app.screen_stack) == 3  # default, start, explorer
    with Store.open(path) as s:
        assert s.complete
    got, want = _activations(path), _reference(tmp_path)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


async def test_esc_leaves_a_cancelled_run_for_the_start_screen_which_marks_the_store_and_R_resumes_it(tmp_path):
    path = tmp_path / "run.h5"
    app = make_app(None, tmp_path)
    events: list = []
    async with app.run_test(size=SIZE, message_hook=_run_events(events)) as pilot:
        await settle(pilot)
        await _start_and_stop(pilot, app, path, events, "escape")  # Esc cancels a running run ...
        await pilot.press("escape")  # ... and leaves a stopped one
        await settle(pilot, lambda a: isinstance(a.screen, StartScreen) and str(path) in a.screen.incomplete)
        start = app.screen
        assert len(app.screen_stack) == 2
        option = start.query_one("#stores").get_option(str(path))
        with Store.open(path) as s:
            assert str(option.prompt).endswith(f"incomplete {s.rows_done(VIT)}/96, R resumes")
        assert start.check_action("resume", ())
        await pilot.press("R")
        await settle(pilot, view_shown("cka"), timeout=90, idle=False)
        assert app.screen.path == path
    with Store.open(path) as s:
        assert s.complete


async def test_R_on_an_incomplete_stores_explorer_resumes_it_and_reopens_the_finished_store(tmp_path):
    path = tmp_path / "half.h5"
    cancel = threading.Event()
    cfg = ExtractConfig(store=path, **dict(RUN, n_images=24, batch_size=4))
    run_extraction(cfg, lambda e: cancel.set() if e.stage == "extract" and e.done >= 8 else None, cancel)
    app = make_app(path, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, lambda a: a.screen.summary is not None)
        hint = f"extraction incomplete: 8 of 24 images; R resumes it (or `vitsee extract {path}`)"
        assert (hint, "error") in notifications(app)
        assert app.check_action("resume", ())
        await pilot.press("R")
        await settle(pilot, view_shown("cka"), timeout=90, idle=False)
        assert len(app.screen_stack) == 2  # the finished store's explorer replaced the incomplete one's
        assert not app.check_action("resume", ())
    with Store.open(path) as s:
        assert s.complete


async def test_a_store_another_process_is_extracting_names_that_writer_instead_of_offering_R(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "half.h5"
    cancel = threading.Event()
    run_extraction(
        ExtractConfig(store=path, **dict(RUN, n_images=24, batch_size=4)),
        lambda e: cancel.set() if e.stage == "extract" and e.done >= 8 else None,
        cancel,
    )
    code = (
        "from vitsee.store.lock import WriteLock; import time\n"
        f"lock = WriteLock({str(path)!r}, command='vitsee extract'); print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        app = make_app(path, tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot, lambda a: a.screen.summary is not None)
            texts = [text for text, _severity in notifications(app)]
            assert any(f"being written by process {holder.pid} (vitsee extract" in t for t in texts), texts
            assert not any("R resumes" in t for t in texts)
            assert not app.check_action("resume", ())
        start = make_app(None, tmp_path)
        async with start.run_test(size=SIZE) as pilot:

            def marked(a) -> bool:
                return isinstance(a.screen, StartScreen) and "written by" in str(
                    a.screen.query_one("#stores").get_option(str(path)).prompt
                )

            await settle(pilot, marked)
            prompt = str(start.screen.query_one("#stores").get_option(str(path)).prompt)
            assert f"extracting 8/24, written by process {holder.pid}" in prompt and "R resumes" not in prompt
            assert str(path) not in start.screen.incomplete and not start.screen.check_action("resume", ())
    finally:
        holder.kill()
        holder.wait()


async def test_esc_leaves_a_failed_first_run_for_the_start_screen_and_r_tries_the_plan_again(tmp_path):
    from vitsee.errors import VitseeError

    tries = []

    def prepare() -> RunPlan:
        tries.append(1)
        raise VitseeError("unknown model 'nope': see `vitsee models PATTERN`")

    app = make_app(None, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.pop_screen()  # as `vitsee-tui --demo` starts: the run is the first screen
        app.push_screen(RunScreen(app.options, prepare, "a run that cannot start"))
        await settle(pilot, lambda a: isinstance(a.screen, RunScreen) and not a.screen.running)
        assert "unknown model 'nope'" in str(app.screen.query_one("#run-stage").render())
        await pilot.press("r")  # nothing was extracted: the plan is tried again
        await settle(pilot, lambda a: len(tries) == 2 and not a.screen.running)
        await pilot.press("escape")
        await settle(pilot, lambda a: isinstance(a.screen, StartScreen))
        assert len(app.screen_stack) == 2
