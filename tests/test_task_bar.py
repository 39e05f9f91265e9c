"""The task bar: progress of a worker's analysis, with the time left estimated from the time per unit so far."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from conftest import VIT
from helpers.app import SIZE, make_app, settle, view_shown
from vitsee.tui.messages import AnalysisStep
from vitsee.tui.results import yield_cpu_to_event_loop
from vitsee.tui.widgets.task_bar import EtaClock, StepThrottle, TaskBar, format_eta


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize("seconds, text", [(0, "0:00"), (42.4, "0:42"), (61, "1:01"), (3725, "1:02:05")])
def test_eta_reads_minutes_and_seconds_then_hours(seconds, text):
    assert format_eta(seconds) == text


def test_eta_is_the_time_per_unit_so_far_times_the_units_left():
    clock = FakeClock()
    eta = EtaClock(now=clock)
    assert eta.update(0, 100) is None  # the job starts: nothing to go on yet
    clock.t += 0.5
    assert eta.update(10, 100) is None  # under a second: start-up noise
    clock.t += 19.5
    assert eta.update(40, 100) == pytest.approx(20.0 / 40 * 60)  # 0.5 s per unit, 60 units left
    clock.t += 5
    assert eta.update(3, 50) is None  # another job (another total): the clock starts over
    clock.t += 4
    assert eta.update(13, 50) == pytest.approx(4.0 / 10 * 37)


def test_the_throttle_lets_ten_steps_a_second_through_and_always_the_last():
    clock = FakeClock()
    shown = StepThrottle(0.1, now=clock)
    passed = []
    for done in range(1, 101):  # 100 steps in 1 s
        clock.t += 0.01
        passed.append(shown(done, 100))
    assert 9 <= sum(passed) <= 11 and passed[0] and passed[-1]


async def test_probe_progress_reaches_the_task_bar_with_percentage_and_eta(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, view_shown("cka"))
        screen = app.screen
        bar = screen.query_one("#background-task", TaskBar)
        clock = FakeClock()
        bar.clock.now = clock
        assert not bar.running
        screen.post_message(AnalysisStep(f"probes:{VIT}", f"probes {VIT}", 0, 480, "stem"))
        await pilot.pause()
        assert bar.running and "probes" in bar.text and "0%" in bar.text and "ETA" not in bar.text
        clock.t += 28
        screen.post_message(AnalysisStep(f"probes:{VIT}", f"probes {VIT}", 192, 480, "blocks.3"))
        await pilot.pause()
        assert bar.text.endswith("blocks.3  40%  ETA 0:42")  # 28 s for 192 images read, 288 to go
        screen.post_message(AnalysisStep(f"probes:{VIT}", f"probes {VIT}", 480, 480, "norm"))
        await pilot.pause()
        assert "100%  ETA 0:00" in bar.text


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_a_computing_worker_thread_yields_the_cpu_and_the_event_loop_thread_keeps_its_priority():
    seen = {}

    def worker():
        tid = threading.get_native_id()
        before = os.getpriority(os.PRIO_PROCESS, tid)
        seen["lowered"] = yield_cpu_to_event_loop(nice=3)
        seen["change"] = os.getpriority(os.PRIO_PROCESS, tid) - before

    main_before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen["lowered"] and seen["change"] == min(3, 19 - main_before)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main_before
