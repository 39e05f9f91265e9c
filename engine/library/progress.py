"""Progress for `vitsee.extract`, `vitsee.train` and views computed on demand: the engine's progress events as
tqdm bars (`tqdm.auto`: a widget in Jupyter, text on stderr in a terminal), or nothing with progress=False.

The CLI draws the same events with Rich; the bars here are a notebook's. Warnings (non-finite activations) are
not progress: they go through Python's `warnings` as a `VitseeWarning` whether or not bars are drawn.
"""

from __future__ import annotations

import warnings


class VitseeWarning(UserWarning):
    """Something in a finished run to look at (e.g. layers whose activations hold NaN/Inf); the run is kept."""


class Bars:
    """Receives the engine's progress events and draws one bar at a time; `close()` ends the last one."""

    def __init__(self, enabled: bool = True):
        self.enabled = bool(enabled)
        self._bar = None
        self._key = None

    def __enter__(self) -> Bars:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._bar, self._key = None, None

    def _show(self, key, description: str, total: int, done: int, unit: str = "it", leave: bool = True, **postfix):
        if self._key != key:
            from tqdm.auto import tqdm

            self.close()
            self._bar = tqdm(total=total, desc=description, unit=unit, leave=leave, dynamic_ncols=True)
            self._key = key
        self._bar.update(done - self._bar.n)
        if postfix:
            self._bar.set_postfix(postfix, refresh=False)

    def _write(self, text: str) -> None:
        from tqdm.auto import tqdm

        tqdm.write(text)  # above the bar, which stays where it is

    def extraction(self, event) -> None:
        """Takes an extraction's events (engine/extraction/plan.py `Progress`)."""
        if event.stage == "warning":
            warnings.warn(event.message, VitseeWarning, stacklevel=2)
            return
        if not self.enabled:
            return
        if event.stage in ("plan", "load"):
            self._write(event.message)
        elif event.stage == "extract":
            self._show("extract", "extract", event.total, event.done, unit="img")
        elif event.stage == "done":
            self.close()

    def analysis(self, step) -> None:
        """Takes an analysis's steps (engine/analyses/base.py `Step`)."""
        if self.enabled:
            self._show(("analysis", step.analysis, step.total), step.analysis, step.total, step.done)

    def training(self, event) -> None:
        """Takes a training run's events (engine/training/train.py `TrainEvent`)."""
        if not self.enabled:
            return
        if event.stage in ("plan", "done"):
            self.close()
            self._write(event.message)
        elif event.stage == "step":
            self._show(
                ("epoch", event.epoch),
                f"epoch {event.epoch}/{event.epochs}",
                event.total,
                event.done,
                unit="step",
                leave=False,
                loss=f"{event.loss:.3f}",
                acc=f"{event.accuracy:.3f}",
            )
        elif event.stage == "epoch":
            self.close()
            r = event.row
            self._write(
                f"epoch {r['epoch']}/{event.epochs}  loss {r['train_loss']:.4f}  train acc "
                f"{r['train_accuracy']:.3f}  test acc {r['test_accuracy']:.3f}  {r['seconds']:.1f} s"
            )
