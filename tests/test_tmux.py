"""The real vitsee-tui in a real terminal: tmux at 160x48, keys sent with send-keys, the screen read back
with capture-pane. Catches what headless tests cannot: the console script, terminal setup, colours on the
wire, quitting cleanly.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import VIT
from helpers.app import analysed_copy

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install -y tmux)")

SOCKET = f"vitsee-test-{os.getpid()}"  # a private tmux server: never touches the user's sessions
# the value, then (a result with statistics) its interval and p-value: "CKA 0.9996 [0.999, 1.000] rough  p<0.01"
STATUS = re.compile(
    r"^ (\S+) x (\S+)  CKA (-?\d\.\d{4})(?: \[-?[\d.]+, -?[\d.]+\](?: rough)?)?(?:  p[<=]+[\d.]+)?\s*$", re.M
)


@pytest.fixture(scope="module")
def store(tiny_store, tmp_path_factory):
    return analysed_copy(tiny_store, tmp_path_factory.getbasetemp())


def tmux(*args: str, check: bool = True) -> str:
    result = subprocess.run(["tmux", "-L", SOCKET, *args], capture_output=True, text=True, timeout=20)
    if check and result.returncode:
        raise AssertionError(f"tmux {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def screen(colours: bool = False) -> str:
    return tmux("capture-pane", "-p", *(["-e"] if colours else []), "-t", "app")


def wait_for(predicate, what: str, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = screen()
        if predicate(text):
            return text
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}; the screen was:\n{text}")


@pytest.fixture
def app_in_tmux(store, tmp_path):
    script = Path(sys.executable).with_name("vitsee-tui")
    command = f"cd {tmp_path} && {script} {store} --export-dir {tmp_path / 'exports'}"
    tmux(
        "-f",
        "/dev/null",
        "new-session",
        "-d",
        "-s",
        "app",
        "-x",
        "160",
        "-y",
        "48",
        "env",
        "-u",
        "COLUMNS",
        "-u",
        "LINES",
        "TERM=tmux-256color",
        "HF_HUB_OFFLINE=1",
        "sh",
        "-c",
        command,
    )
    yield
    tmux("kill-server", check=False)


def session_alive() -> bool:
    return subprocess.run(["tmux", "-L", SOCKET, "has-session", "-t", "app"], capture_output=True).returncode == 0


def test_keys_sent_to_the_real_app_change_what_the_terminal_shows(app_in_tmux):
    first = wait_for(lambda s: STATUS.search(s), "the CKA view and its status line")
    row, col, _ = STATUS.search(first).groups()
    assert (row, col) == ("patch_embed", "maxpool")  # two models: the app opens on the ViT x ResNet CKA
    assert "1 CKA" in first and "2 Attention" in first and VIT.partition("@")[0] in first

    coloured = screen(colours=True)
    assert "\x1b[" in coloured and "\u2580" in coloured  # half blocks drawn in colour on the wire

    tmux("send-keys", "-t", "app", "Right")
    moved = wait_for(lambda s: STATUS.search(s) and STATUS.search(s).group(2) == "layer1.0", "the cursor to move right")
    assert STATUS.search(moved).group(1) == "patch_embed"

    tmux("send-keys", "-t", "app", "Down", "Down")
    wait_for(lambda s: STATUS.search(s) and STATUS.search(s).group(1) == "blocks.1", "the cursor to move down")

    tmux("send-keys", "-t", "app", "2")
    attention = wait_for(
        lambda s: "Mean attention distance" in s and re.search(r"^ blocks\.0 head \d", s, re.M),
        "the attention view and its status line",
    )
    assert "\u25b2uniform 32.1" in attention  # the uniform-attention distance marked on the axis

    tmux("send-keys", "-t", "app", "a", "1")
    wait_for(lambda s: "CKA: test_resnet (random init)" in s and STATUS.search(s), "model A to become the ResNet")

    tmux("send-keys", "-t", "app", "q")
    deadline = time.monotonic() + 20
    while session_alive() and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not session_alive(), "q did not quit the app"
