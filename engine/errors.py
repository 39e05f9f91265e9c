"""The one exception type for failures a user can cause."""


class VitseeError(Exception):
    """A failure the user can fix: the message names the bad value and the way out, in one line.

    The CLI prints it without a traceback and exits non-zero; the terminal app shows it as a notification.
    """
