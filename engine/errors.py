"""The one exception type for failures a user can cause."""


class VitseeError(Exception):
    """A failure the user can fix: the message names the bad value and the way out, in one line.

    The CLI prints it without a traceback and exits non-zero; the terminal app shows it as a notification.
    """


def brief(exc: BaseException, limit: int = 160) -> str:
    """Returns `Type: first line of the message`, cut to limit characters, for quoting a library error."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class VitseeNote(UserWarning):
    """Something the user should know that changed nothing of theirs (e.g. files of another store moved aside).

    Issued with warnings.warn, in one line; the CLI prints it as `note: ...` on stderr.
    """
