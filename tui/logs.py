"""Where the app's log goes: a file under $XDG_STATE_HOME/vitsee/ (~/.local/state/vitsee/ by default), and Textual's
devtools console when one is attached (`textual console`, then `textual run --dev`). A bug the app survives is one
line on screen that names the file holding its traceback (`bug_text`)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from vitsee.errors import brief

LOGGER = "vitsee"  # every module logs under it (logging.getLogger(__name__) in vitsee.*)
FILE_NAME = "vitsee-tui.log"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_path() -> Path:
    """Returns the app's log file: $XDG_STATE_HOME/vitsee/vitsee-tui.log (~/.local/state/... when it is unset)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "vitsee" / FILE_NAME


def setup_logging() -> Path:
    """Sends the vitsee loggers' records (INFO and up) to the log file and to Textual's devtools; returns the file.

    Called by every app at start; a second call (another app in the same process) changes nothing. The file is
    opened at the first record, so an app that logs nothing writes nothing."""
    path = log_path()
    logger = logging.getLogger(LOGGER)
    if not any(getattr(h, "vitsee_log", None) == path for h in logger.handlers):
        for handler in [h for h in logger.handlers if getattr(h, "vitsee_log", None) is not None]:
            logger.removeHandler(handler)  # $XDG_STATE_HOME changed: the old file is no longer where we say
            handler.close()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            to_file: logging.Handler = logging.FileHandler(path, delay=True, encoding="utf-8")
        except OSError:  # a read-only home: the devtools console still hears it
            to_file = logging.NullHandler()
        to_file.setFormatter(logging.Formatter(FORMAT))
        to_file.vitsee_log = path  # type: ignore[attr-defined]
        logger.addHandler(to_file)
    if not any(type(h).__name__ == "TextualHandler" for h in logger.handlers):
        from textual.logging import TextualHandler

        logger.addHandler(TextualHandler(stderr=False, stdout=False))  # to devtools only, when attached
    logger.setLevel(logging.INFO)
    return path


def bug_text(what: str, exc: BaseException) -> str:
    """Returns the line that reports a bug the app survived: what failed, the error, and the file with its traceback
    (log the exception with `log.exception` first)."""
    return f"{what}: {brief(exc)} (a bug: the traceback is in {log_path()})"
