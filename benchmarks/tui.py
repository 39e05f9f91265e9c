"""What one heatmap cursor move costs: time from the key to the repainted screen, and bytes on the wire.

Runs vitsee-tui itself (the explorer screen: title bar, side panel, tabs, status line, footer) on its CKA
view of a 200 x 200 matrix in a 160 x 48 terminal, presses ~200 cursor keys and, for each, times the key
event to the last terminal write of its frame and counts the bytes written. The store is simulated: the
explorer's two readers return a summary and a view made here, so only the app is measured. `--widget`
measures the bare Heatmap with a status line instead. The app's driver is Textual's headless one with its
output switched back on and sent to a counter, so every frame is composed and encoded exactly as for a
real terminal.

Keys arrive 40 ms apart, about a held key's repeat rate: Textual paints at most 60 frames a second, so
keys sent back to back would measure that cap instead of the widget.

    python benchmarks/tui.py                      # the app's CKA view, 1:1 and fit, truecolor
    python benchmarks/tui.py --zoom 1:1 --color-mode 256 --moves 400
    python benchmarks/tui.py --widget             # the Heatmap alone
    python benchmarks/tui.py --while-probes       # key latency while a probe worker computes
    python benchmarks/tui.py --while-probes --same-priority   # ... the worker at the event loop's priority
    python benchmarks/tui.py --while-probes --no-worker       # ... the same keys with nothing computing

Targets: median under 16 ms and under 4 KB per move; the exit status is 1 when a median misses them.

`--first-frame` times what a user waits for at launch: `vitsee-tui --demo` and `vitsee-tui STORE` on the same cached
demo store, each a whole process in a pseudo-terminal (120 x 40, truecolor), from its start to the first heatmap
cell written to the terminal (the upper half block the heatmap draws with), with the process's CPU seconds at that
moment; launches interleaved over --rounds, each command once before as a warm-up (untimed). The demo store is built
by a first `--demo` launch when the cache folder has none (minutes: it trains two small models). With
--compare-with SRC another source tree (benchmarks/checkout.py) is launched the same way in the same rounds.
Target: --demo's median within 1.2x of STORE's.

    python benchmarks/tui.py --first-frame --cache /tmp/vitsee-cache --rounds 9
    python benchmarks/tui.py --first-frame --cache /tmp/vitsee-cache --compare-with /tmp/vitsee-old

`--while-probes` measures what a user feels while the app computes: the explorer's background worker (the one
that caches every view) runs the real `run_probes` on the 32-image MLP-Mixer store of benchmarks/probes.py,
over and over, its progress going to the task bar as in the app, while cursor keys arrive --key-gap-ms apart;
each key is timed from the press to the first terminal write after the heatmap moved its cursor. Target: every
key (p95 and max too) under 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

LATENCY_TARGET_MS = 100.0
COLOR_SYSTEMS = {"truecolor": "truecolor", "256": "256", "16": "standard", "none": "truecolor"}
KEY_INTERVAL_S = 0.040
TARGET_MS, TARGET_BYTES = 16.0, 4096


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--moves", type=int, default=200)
    parser.add_argument("--size", default="160x48", help="terminal WIDTHxHEIGHT")
    parser.add_argument("--matrix", type=int, default=200, help="rows and columns of the matrix")
    parser.add_argument("--zoom", action="append", choices=["fit", "1:1", "detail"], help="default: 1:1 and fit")
    parser.add_argument("--color-mode", default="truecolor", choices=list(COLOR_SYSTEMS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--widget", action="store_true", help="measure the bare Heatmap, not the app")
    parser.add_argument("--while-probes", action="store_true", help="key latency while a probe worker computes")
    parser.add_argument(
        "--probe-store",
        type=Path,
        default=None,
        help="store for --while-probes (default: benchmarks/probes.py's, built when missing)",
    )
    parser.add_argument("--no-worker", action="store_true", help="--while-probes without the worker: the baseline")
    parser.add_argument(
        "--same-priority",
        action="store_true",
        help="--while-probes with the worker at the event loop's CPU priority (as before)",
    )
    parser.add_argument("--key-gap-ms", type=float, default=150.0, help="--while-probes: time between keys")
    parser.add_argument(
        "--first-frame",
        action="store_true",
        help="time vitsee-tui --demo and vitsee-tui STORE from process start to the first heatmap",
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="--first-frame: XDG_CACHE_HOME with the demo store (default: the user's; built when missing)",
    )
    parser.add_argument("--rounds", type=int, default=7, help="--first-frame: interleaved launches of each command")
    parser.add_argument("--offline", action="store_true", help="--first-frame: with HF_HUB_OFFLINE=1")
    parser.add_argument(
        "--compare-with",
        type=Path,
        default=None,
        help="--first-frame: also launch the vitsee of this source tree (another commit's checkout)",
    )
    return parser.parse_args()


ARGS = parse_args()
# Textual reads its colour system when first imported: make the encoded frames those of such a terminal.
os.environ["TEXTUAL_COLOR_SYSTEM"] = COLOR_SYSTEMS[ARGS.color_mode]

import numpy as np  # noqa: E402
from textual import events  # noqa: E402
from textual.app import App, ComposeResult  # noqa: E402
from textual.drivers import headless_driver  # noqa: E402
from textual.widgets import Label  # noqa: E402

from vitsee.tui.widgets import Heatmap  # noqa: E402


class CountingDriver(headless_driver.HeadlessDriver):
    """A headless driver whose output is counted instead of discarded."""

    bytes_written = 0
    write_times: list[float] = []

    @property
    def is_headless(self) -> bool:
        return False  # so the app composes, encodes and writes every frame

    def reset(self) -> None:
        self.bytes_written, self.write_times = 0, []

    def write(self, data: str) -> None:
        self.bytes_written += len(data.encode("utf-8"))
        self.write_times.append(time.perf_counter())


class HeatmapBench(App):
    CSS = "Heatmap { height: 1fr; }"

    def __init__(self, matrix: np.ndarray, zoom: str, color_mode: str) -> None:
        super().__init__()
        labels = [f"blocks.{i}" for i in range(len(matrix))]
        self.heatmap = Heatmap(matrix, labels, labels, zoom=zoom, color_mode=color_mode)

    def compose(self) -> ComposeResult:
        yield self.heatmap
        yield Label(id="status")

    def on_heatmap_cursor_moved(self, message: Heatmap.CursorMoved) -> None:
        self.query_one("#status", Label).update(message.summary)


def cka_like(n: int) -> np.ndarray:
    """A smooth, banded layer x layer similarity, like CKA between blocks of one model."""
    i = np.arange(n)
    return np.exp(-np.abs(i[:, None] - i[None, :]) / (n / 8)) * (0.7 + 0.3 * np.cos(i[None, :] / 9))


def cursor_walk(moves: int, seed: int) -> list[str]:
    """A random walk drifting right and down, with the odd page jump (which scrolls the view)."""
    rng = np.random.default_rng(seed)
    keys = ["right", "down", "left", "up", "pagedown", "pageup"]
    return list(rng.choice(keys, size=moves, p=[0.38, 0.28, 0.14, 0.14, 0.03, 0.03]))


def time_widget_work(heatmap: Heatmap) -> list[float]:
    """Wrap the heatmap's cursor watcher and render_line; return the list their durations add up in."""
    spent = [0.0]

    def timed(method):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - start

        return wrapper

    heatmap.render_line = timed(heatmap.render_line)
    heatmap.watch_cursor = timed(heatmap.watch_cursor)
    return spent


def app_on_cka_view(matrix: np.ndarray, zoom: str, color_mode: str):
    """Returns vitsee-tui opened on a simulated store whose CKA view is `matrix`."""
    from vitsee.output.colormap import ColorMode
    from vitsee.analyses.views import View
    from vitsee.tui import results
    from vitsee.tui.app import VitseeApp
    from vitsee.tui.options import AppOptions
    from vitsee.tui.widgets import store_watch, view_panes

    key = "vit_bench@random:0"
    layers = [f"blocks.{i}" for i in range(len(matrix))]
    shapes = {layer: (197, 768) for layer in layers}
    summary = results.StoreSummary(
        Path("bench.h5"),
        1024,
        "synthetic",
        [
            results.ModelSummary(
                key=key,
                family="vit",
                weights="random init (seed 0)",
                layers=layers,
                shapes=shapes,
                rows_done=1024,
            )
        ],
    )
    view = View("cka", f"cka:{key}", f"CKA {key}", "", matrix, layers, layers, "CKA", 0.0, 1.0, {}, {}, [key, key])
    loaded = results.LoadedView(f"cka:{key}", view, False, 0.0, {key: shapes})
    store_watch.read_summary = lambda path: summary  # where the explorer reads the store and its views
    view_panes.read_view = lambda path, spec, cfg, progress=None, cancelled=None, warn=None, options=None: loaded
    app = VitseeApp(Path("bench.h5"), options=AppOptions(color_mode=ColorMode.parse(color_mode)))
    app.bench_zoom = zoom
    return app


async def heatmap_ready(app, pilot) -> Heatmap:
    """Waits for the app's heatmap (the widget bench has it at once) and sets the zoom."""
    if isinstance(app, HeatmapBench):
        return app.heatmap
    for _ in range(200):
        await pilot.pause(0.05)
        found = app.screen.query(Heatmap)
        if found:
            heatmap = found.first()
            heatmap.zoom = app.bench_zoom
            return heatmap
    raise RuntimeError("the app never showed its CKA heatmap")


async def measure(zoom: str) -> dict[str, list[float]]:
    width, height = map(int, ARGS.size.lower().split("x"))
    matrix = cka_like(ARGS.matrix)
    app = HeatmapBench(matrix, zoom, ARGS.color_mode) if ARGS.widget else app_on_cka_view(matrix, zoom, ARGS.color_mode)
    result: dict[str, list[float]] = {"first_ms": [], "last_ms": [], "bytes": [], "widget_ms": [], "scroll_bytes": []}
    async with app.run_test(size=(width, height)) as pilot:
        driver = app._driver
        assert isinstance(driver, CountingDriver)
        heatmap = await heatmap_ready(app, pilot)
        await pilot.pause()
        await asyncio.sleep(0.3)  # the first full frame
        spent = time_widget_work(heatmap)
        for key in cursor_walk(ARGS.moves, ARGS.seed):
            scroll_before = heatmap.scroll_offset
            driver.reset()
            spent[0] = 0.0
            event = events.Key(key, None)
            event.set_sender(app)
            pressed = time.perf_counter()
            driver.send_message(event)  # the path a real key takes
            await asyncio.sleep(KEY_INTERVAL_S)
            if not driver.write_times:  # a key against an edge changes nothing and writes nothing
                continue
            if heatmap.scroll_offset != scroll_before:  # a full repaint: counted apart
                result["scroll_bytes"].append(driver.bytes_written)
                continue
            result["first_ms"].append((driver.write_times[0] - pressed) * 1000)
            result["last_ms"].append((driver.write_times[-1] - pressed) * 1000)
            result["bytes"].append(driver.bytes_written)
            result["widget_ms"].append(spent[0] * 1000)
    return result


def probe_job(store_path: Path):
    """Returns read_view's stand-in for probes:MODEL specs: the real run_probes on store_path, recomputed."""
    from vitsee.analyses.probes import run_probes
    from vitsee.analyses.driver import AnalyzeConfig
    from vitsee.store import Store
    from vitsee.threads import set_compute_threads
    from vitsee.tui.results import Cancelled, yield_cpu_to_event_loop

    def compute(path, spec, cfg, progress=None, cancelled=lambda: False, warn=None):
        def step(event):
            if cancelled():
                raise Cancelled(spec)
            progress(event)

        if not ARGS.same_priority:
            yield_cpu_to_event_loop()
        set_compute_threads()  # what read_view does before it computes
        while True:  # until the worker is cancelled (step raises Cancelled)
            with Store.writer(store_path) as store:
                run_probes(store, store.models[0], AnalyzeConfig(device="cpu", recompute=True), step)

    return compute


async def measure_while_probes() -> dict[str, list[float]]:
    """Returns key -> frame latencies (ms) and the progress events seen, while probes compute in a worker."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("probes_benchmark", Path(__file__).with_name("probes.py"))
    probes_benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probes_benchmark)
    from vitsee.tui.widgets import caching_bar
    from vitsee.tui.widgets.task_bar import TaskBar

    store_path = ARGS.probe_store or Path(tempfile.gettempdir()) / "vitsee-bench-probes-tui.h5"
    probes_benchmark.build_store(store_path, "mixer_b16_224@random:0", 32, 224, probes_benchmark.MIXER_BLOCKS, "cpu")
    width, height = map(int, ARGS.size.lower().split("x"))
    app = app_on_cka_view(cka_like(ARGS.matrix), "1:1", ARGS.color_mode)
    shown = caching_bar.read_view
    compute = probe_job(store_path)
    caching_bar.read_view = lambda path, spec, *a, **k: (compute if spec.startswith("probes") else shown)(
        path, spec, *a, **k
    )
    result: dict[str, list[float]] = {"ms": [], "bar_texts": []}
    async with app.run_test(size=(width, height)) as pilot:
        driver = app._driver
        heatmap = await heatmap_ready(app, pilot)
        screen = app.screen
        moved: list[float] = []
        watch = heatmap.watch_cursor

        def watch_cursor(old, new):  # Textual passes (old, new) to a watcher of two parameters
            watch(old, new)
            moved.append(time.perf_counter())

        heatmap.watch_cursor = watch_cursor
        if not ARGS.no_worker:
            screen._analyse_all()  # the app's own background worker (probes among its views), cancelled below
        bar = screen.query_one("#background-task", TaskBar)
        await asyncio.sleep(2.0)  # past the first layer: reading and solving
        for key in cursor_walk(ARGS.moves, ARGS.seed):
            driver.reset()
            moved.clear()
            event = events.Key(key, None)
            event.set_sender(app)
            pressed = time.perf_counter()
            driver.send_message(event)
            await asyncio.sleep(ARGS.key_gap_ms / 1000)
            if not moved:
                continue  # a key against an edge moves nothing
            after = [t for t in driver.write_times if t >= moved[0]]
            if after:
                result["ms"].append((after[0] - pressed) * 1000)
            result["bar_texts"].append(getattr(bar, "text", ""))
        for worker in screen.workers:
            worker.cancel()
        await pilot.pause(0.5)
    return result


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[int(0.9 * (len(ordered) - 1))]
    return f"median {statistics.median(ordered):8.2f}   p90 {p90:8.2f}   max {ordered[-1]:9.2f}"


def main() -> int:
    import textual

    if ARGS.first_frame:
        return report_first_frame()
    zooms = ARGS.zoom or ["1:1", "fit"]
    print(
        f"{'Heatmap widget' if ARGS.widget else 'vitsee-tui CKA view'} {ARGS.matrix}x{ARGS.matrix}, "
        f"terminal {ARGS.size}, colour {ARGS.color_mode}, "
        f"{ARGS.moves} keys {KEY_INTERVAL_S * 1000:.0f} ms apart (textual {textual.__version__}, "
        f"python {sys.version.split()[0]})"
    )
    headless_driver.HeadlessDriver = CountingDriver  # run_test looks the class up here at start-up
    if ARGS.while_probes:
        return report_while_probes()
    ok = True
    for zoom in zooms:
        result = asyncio.run(measure(zoom))
        moves, scrolls = len(result["bytes"]), result["scroll_bytes"]
        print(
            f"\nzoom {zoom}: {moves} moves within the view"
            + (
                f", {len(scrolls)} that scrolled it (full repaint, median {statistics.median(scrolls) / 1024:.0f} KB)"
                if scrolls
                else ""
            )
        )
        print(f"  key -> heatmap frame written (ms)   {summary(result['first_ms'])}")
        print(f"  key -> status line written too (ms) {summary(result['last_ms'])}")
        print(f"  heatmap's own work per move (ms)    {summary(result['widget_ms'])}")
        print(f"  bytes written per move              {summary(result['bytes'])}")
        ok &= statistics.median(result["first_ms"]) < TARGET_MS and statistics.median(result["bytes"]) < TARGET_BYTES
    print(f"\ntargets: median < {TARGET_MS:.0f} ms and < {TARGET_BYTES} bytes per move: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


def report_while_probes() -> int:
    result = asyncio.run(measure_while_probes())
    ms = sorted(result["ms"])
    p50, p95 = statistics.median(ms), ms[int(0.95 * (len(ms) - 1))]
    print(
        f"{'with no worker (baseline)' if ARGS.no_worker else 'while a probe worker computes'} "
        f"(load average {os.getloadavg()[0]:.1f}): {len(ms)} keys "
        f"{ARGS.key_gap_ms:.0f} ms apart"
    )
    print(f"  key -> frame with the moved cursor (ms)   p50 {p50:7.1f}   p95 {p95:7.1f}   max {ms[-1]:7.1f}")
    texts = [t for t in result["bar_texts"] if t]
    print(f"  task bar, last seen: {texts[-1] if texts else '(empty)'}")
    ok = ms[-1] < LATENCY_TARGET_MS and p95 < LATENCY_TARGET_MS
    print(f"target: every key under {LATENCY_TARGET_MS:.0f} ms: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


# --- time to the first heatmap, whole processes ------------------------------------------------------------------

FIRST_FRAME_TARGET = 1.2
APP = "from vitsee.tui.app import main; main()"  # what the vitsee-tui script runs


def process_cpu_s(pid: int) -> float:
    """Returns the CPU seconds (user + system, all threads) a running process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def launch_to_heatmap(args: list[str], env: dict[str, str], cwd: Path, timeout_s: float = 60.0) -> tuple[float, float]:
    """Starts `python -c APP *args` in a pseudo-terminal; returns (wall, CPU) seconds from the start to the first
    heatmap cell on the terminal, then quits the app with q (it is killed if it has not exited 15 s later)."""
    import fcntl
    import pty
    import select
    import signal
    import struct
    import subprocess
    import termios

    from vitsee.tui.widgets.heatmap import UPPER_HALF

    mark = UPPER_HALF.encode()
    width, height = 120, 40
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", APP, *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    os.close(slave)
    tail, found = b"", None
    try:
        while found is None and time.perf_counter() - start < timeout_s and proc.poll() is None:
            if not select.select([master], [], [], 0.2)[0]:
                continue
            chunk = os.read(master, 1 << 16)
            if mark in tail[-4:] + chunk:
                found = (time.perf_counter() - start, process_cpu_s(proc.pid))
            tail = (tail + chunk)[-4096:]
        os.write(master, b"q")
        quit_by = time.perf_counter() + 15
        while proc.poll() is None and time.perf_counter() < quit_by:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    os.read(master, 1 << 16)
                except OSError:
                    break
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        os.close(master)
    if found is None:
        text = tail.decode("utf-8", "replace")[-600:]
        raise SystemExit(
            f"vitsee-tui {' '.join(args)} showed no heatmap within {timeout_s:.0f} s; its last output: {text!r}"
        )
    return found


def report_first_frame() -> int:
    import tempfile

    from checkout import env_for

    work = Path(tempfile.mkdtemp(prefix="vitsee-first-frame-"))
    base = dict(
        os.environ,
        TERM="xterm-256color",
        COLORTERM="truecolor",
        XDG_CONFIG_HOME=str(work / "config"),
        XDG_STATE_HOME=str(work / "state"),
    )
    base.pop("NO_COLOR", None)
    if ARGS.cache is not None:
        base["XDG_CACHE_HOME"] = str(ARGS.cache.resolve())
    if ARGS.offline:
        base["HF_HUB_OFFLINE"] = "1"
    folder = Path(base.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vitsee"
    stores = sorted(folder.glob("demo-*.h5"), key=lambda p: p.stat().st_mtime)
    if not stores:
        print(f"no demo store in {folder}: building it with vitsee-tui --demo (minutes) ...", flush=True)
        launch_to_heatmap(["--demo"], base, work, timeout_s=3600)
        stores = sorted(folder.glob("demo-*.h5"), key=lambda p: p.stat().st_mtime)
    store = stores[-1]
    codes = {"this checkout": env_for(None, base)}
    if ARGS.compare_with is not None:
        codes[f"{ARGS.compare_with}"] = env_for(ARGS.compare_with, base)
    commands = {"vitsee-tui STORE": [str(store)], "vitsee-tui --demo": ["--demo"]}
    runs = [(code, name) for code in codes for name in commands]
    for code, name in runs:  # warm-up: page cache, .pyc files, and the demo's record of the store it opened
        launch_to_heatmap(commands[name], codes[code], work)
    times: dict[tuple[str, str], list[tuple[float, float]]] = {run: [] for run in runs}
    load_before = os.getloadavg()
    for r in range(ARGS.rounds):
        for code, name in runs[r % len(runs) :] + runs[: r % len(runs)]:  # each round starts with another command
            times[code, name].append(launch_to_heatmap(commands[name], codes[code], work))
    load_after = os.getloadavg()
    print(
        f"time to the first heatmap, whole process, {ARGS.rounds} interleaved launches each "
        f"({'HF_HUB_OFFLINE=1' if ARGS.offline else 'Hub not forced offline'}); store {store}"
    )
    print(
        f"load average before {load_before[0]:.2f} / {load_before[1]:.2f}, after {load_after[0]:.2f} / "
        f"{load_after[1]:.2f} (1 / 5 min), {os.cpu_count()} CPUs"
    )
    print(f"{'code':<28} {'command':<20} {'median s':>9} {'min s':>7} {'max s':>7} {'CPU s (median)':>15}")
    ok = True
    for code in codes:
        medians = {}
        for name in commands:
            wall = [w for w, _ in times[code, name]]
            cpu = [c for _, c in times[code, name]]
            medians[name] = statistics.median(wall)
            print(
                f"{code[-28:]:<28} {name:<20} {medians[name]:>9.2f} {min(wall):>7.2f} {max(wall):>7.2f} "
                f"{statistics.median(cpu):>15.2f}"
            )
        ratio = medians["vitsee-tui --demo"] / medians["vitsee-tui STORE"]
        print(f"{code[-28:]:<28} {'--demo / STORE':<20} {ratio:>8.2f}x")
        if code == "this checkout":
            ok = ratio <= FIRST_FRAME_TARGET
    print(f"target: --demo within {FIRST_FRAME_TARGET:.1f}x of STORE: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
