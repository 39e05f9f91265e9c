"""`vitsee.Result`: one view's numbers, labelled, with their intervals, p-values and parameters.

The one module that knows how the engine hands a view over: today a thin adapter over engine/analyses/views.py's
`View` (the numbers `vitsee show` and `vitsee export` print) and engine/output/figures.py (the figure `vitsee export`
draws), so the numbers, the tables and the figures a notebook gets are the CLI's own. When the analyses hand
over typed results of their own, only `Result.__init__` and the properties below change.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

import numpy as np

from vitsee.errors import VitseeError
from vitsee.analyses.views import View, best_cell

STATISTICS = ("ci_low", "ci_high", "p_value")  # each shaped like the values, or absent
NOTEBOOK_DPI = 100  # the export's figure at notebook size (the PNG export draws it at 150 dpi)


class Result:
    """The numbers of one view (`cka:A:B`, `attention:M`, ...): a matrix of values with its row and column
    labels, the intervals and p-values when the result has them, and the parameters that made it.

    Made by `Store.view` and its shortcuts (`store.cka(a, b)`, ...), never by hand. Convert it with
    `to_numpy()`, `to_pandas()`, `to_xarray()`, draw it with `plot()`, write it with `save()`; in a notebook it
    shows its figure and a summary line.
    """

    def __init__(self, view: View):
        self._view = view

    # --- what it is ----------------------------------------------------------------------------------

    @property
    def spec(self) -> str:
        """The view string this result answers, with full model keys (`cka:test_vit@random:0:test_resnet@random:0`)."""
        return self._view.spec

    @property
    def kind(self) -> str:
        """The analysis: cka, attention, probes, skip, spatial, heads or erf."""
        return self._view.kind

    @property
    def models(self) -> list[str]:
        """The store keys of the models the view is about (two for cka across models and heads)."""
        return list(dict.fromkeys(self._view.models))

    @property
    def title(self) -> str:
        return self._view.title

    @property
    def value_name(self) -> str:
        """What a value is ('CKA', 'mean attention distance (px)', 'test accuracy', ...)."""
        return self._view.value_name

    @property
    def rows(self) -> list[str]:
        """The row labels (layers for cka, blocks for attention, ...)."""
        return list(self._view.rows)

    @property
    def cols(self) -> list[str]:
        """The column labels (the other model's layers for cka, heads for attention, readouts for probes, ...)."""
        return list(self._view.cols)

    @property
    def values(self) -> np.ndarray:
        """The (rows, cols) values; NaN where a cell was not computed or is non-finite (see `nonfinite`)."""
        return self._view.matrix

    @property
    def ci_low(self) -> np.ndarray | None:
        """The lower ends of the intervals, shaped like `values` (None: the result has no intervals)."""
        return self._view.ci_low

    @property
    def ci_high(self) -> np.ndarray | None:
        """The upper ends of the intervals, shaped like `values` (None: the result has no intervals)."""
        return self._view.ci_high

    @property
    def p_value(self) -> np.ndarray | None:
        """The permutation p-values, shaped like `values` (None: the result has none)."""
        return self._view.p_value

    @property
    def ci_level(self) -> float:
        """The confidence level of the intervals (0.0 without them)."""
        return self._view.ci_level

    @property
    def nonfinite(self) -> np.ndarray | None:
        """A (rows, cols) bool mask of the cells computed from NaN/Inf inputs (None: the view has none marked)."""
        return self._view.nonfinite

    @property
    def params(self) -> dict:
        """The parameters of the cached result (batch size, shuffles, statistics settings, ...)."""
        return dict(self._view.params)

    @property
    def extra(self) -> dict:
        """What this kind of view holds beside the matrix (head order, uniform distance, token maps, ...), as the
        JSON export writes it."""
        return dict(self._view.extra)

    @property
    def n_images(self) -> int:
        return int(self._view.n_images)

    # --- conversions ---------------------------------------------------------------------------------

    def to_numpy(self) -> np.ndarray:
        """Returns a copy of the (rows, cols) values as float64.

        Returns:
            The matrix `vitsee show --format csv` prints, NaN where a value was not computed.
        """
        return np.array(self._view.matrix, dtype=np.float64)

    def to_pandas(self):
        """Returns the values as a long table, one row per cell.

        Returns:
            A pandas DataFrame with columns `row`, `col` (the labels), `value`, `ci_low`, `ci_high` and `p_value`
            (NaN where the result has no such statistic), in row-major order; `df.attrs` holds the view string,
            the value name and the parameters.

        Raises:
            VitseeError: pandas is not installed.
        """
        pd = _optional("pandas", "to_pandas()")
        n_rows, n_cols = self._view.matrix.shape
        rows = np.repeat(np.asarray(self.rows, dtype=object), n_cols)
        cols = np.tile(np.asarray(self.cols, dtype=object), n_rows)
        table = {"row": rows, "col": cols, "value": self.to_numpy().ravel()}
        for name in STATISTICS:
            values = getattr(self._view, name)
            table[name] = (
                np.asarray(values, dtype=np.float64).ravel() if values is not None else np.full(n_rows * n_cols, np.nan)
            )
        df = pd.DataFrame(table)
        df.attrs.update(view=self.spec, value_name=self.value_name, params=self.params)
        return df

    def to_xarray(self):
        """Returns the values and their statistics as labelled arrays.

        Returns:
            An xarray Dataset with dims `row` and `col` (coordinates: the labels) and the variables `value` and,
            when the result has them, `ci_low`, `ci_high`, `p_value`; its attrs hold the view string, the kind,
            the models, the value name, the number of images and the parameters (as JSON text).

        Raises:
            VitseeError: xarray is not installed.
        """
        xr = _optional("xarray", "to_xarray()")
        data = {"value": (("row", "col"), self.to_numpy())}
        for name in STATISTICS:
            values = getattr(self._view, name)
            if values is not None:
                data[name] = (("row", "col"), np.asarray(values, dtype=np.float64))
        attrs = {
            "view": self.spec,
            "kind": self.kind,
            "models": self.models,
            "value_name": self.value_name,
            "title": self.title,
            "n_images": self.n_images,
            "params": json.dumps(self.params, sort_keys=True),
        }
        if self.ci_low is not None:
            attrs["ci_level"] = self.ci_level
        return xr.Dataset(data, coords={"row": self.rows, "col": self.cols}, attrs=attrs)

    def to_json(self) -> dict:
        """Returns the numbers as `vitsee export VIEW --out FILE.json` writes them (NaN as None)."""
        return self._view.to_json()

    # --- figures and files ---------------------------------------------------------------------------

    @property
    def names(self) -> dict[str, str]:
        """The display names of the view's models (store key -> name): what its title, axes and legends call them
        (`store.set_name` sets one; `plot(labels=...)` another for one figure)."""
        return {key: self._view.name(key) for key in (self.models or self.rows)}

    def plot(
        self,
        selection: tuple[int | str, int | str] | None = None,
        cmap: str = "viridis",
        title: str | None = None,
        labels: dict[str, str] | None = None,
        subtitle: str | None = None,
    ):
        """Returns the figure `vitsee export VIEW --out FILE.png` draws; the last line of a notebook cell shows it.

        Args:
            selection: a cell to mark, as (row, col) indices or labels (the export's cursor cell; none by default).
            cmap: viridis, magma or cividis.
            title: the figure's title instead of the view's ("" for none).
            labels: names for the models in this figure, {model: label} (a model by its store key, display name
                or a unique prefix of its key): its title, axes and legends use them; the store keeps its own.
            subtitle: the line under the title instead of the models' weights and the images ("" for none).

        Returns:
            A matplotlib Figure on an Agg canvas (no pyplot state): shown as itself in a notebook, or
            `fig.savefig(...)`.

        Raises:
            VitseeError: an unknown colormap or model, or a selection outside the matrix.
        """
        from vitsee.output.figures import figure_for

        view = self._relabelled(title, labels, subtitle)
        return figure_for(view, selection=self._cell(selection), cmap=cmap)

    def save(
        self,
        path: str | Path,
        selection: tuple[int | str, int | str] | None = None,
        cmap: str = "viridis",
        title: str | None = None,
        labels: dict[str, str] | None = None,
        subtitle: str | None = None,
    ) -> Path:
        """Writes the view as `vitsee export` does: a figure (.png), its numbers (.json) or a table (.csv).

        Args:
            path: the file to write; its suffix picks what is written. It is written whole or not at all.
            selection: a cell to mark, as (row, col) indices or labels.
            cmap: viridis, magma or cividis.
            title, labels, subtitle: as `plot` (the JSON keeps the models' store keys whatever their labels).

        Returns:
            The path written.

        Raises:
            VitseeError: an unknown suffix, colormap or model, or a folder that does not take the file.
        """
        from vitsee.output.export import write_view

        view = self._relabelled(title, labels, subtitle)
        return write_view(view, path, selection=self._cell(selection), cmap=cmap)

    def _relabelled(self, title: str | None, labels: dict[str, str] | None, subtitle: str | None) -> View:
        """Returns the view with another title, subtitle or model names (the same view when none is given)."""
        from dataclasses import replace

        from vitsee.analyses.views import with_names

        view = self._view
        if labels:
            names = dict(view.names)
            changed = {}
            for model, label in labels.items():
                key = self._model_key(model)
                changed[view.name(key)] = str(label)
                names[key] = str(label)
            view = replace(
                view, names=names, title=with_names(view.title, changed), subtitle=with_names(view.subtitle, changed)
            )
        if title is not None:
            view = replace(view, title=str(title))
        if subtitle is not None:
            view = replace(view, subtitle=str(subtitle))
        return view

    def _model_key(self, model: str) -> str:
        """Returns the store key of one of the view's models named by its key, display name or a unique key prefix."""
        keys = list(dict.fromkeys([*self._view.models, *self._view.names]))
        if model in keys:
            return model
        named = [k for k in keys if self._view.names.get(k) == model]
        prefixed = [k for k in keys if k.startswith(model)]
        if named or len(prefixed) == 1:
            return (named or prefixed)[0]
        raise VitseeError(
            f"no model '{model}' in {self.spec}: name one of "
            + ", ".join(f"{self._view.name(k)!r}" for k in (self.models or self.rows))
        )

    def summary(self) -> str:
        """Returns one line: the view (its title: the models by their display names), its size, and the cell
        `vitsee show` reports with its interval."""
        view = self._view
        n_rows, n_cols = view.matrix.shape
        line = f"{view.title}: {view.value_name}, {n_rows} x {n_cols}"
        best = best_cell(view)
        if best is not None:
            r, c = best
            which = "highest" if view.analysis.higher_is_better else "lowest"  # a distance: the most alike is lowest
            rows, cols = view.name(view.rows[r]), view.name(view.cols[c])  # the zoo's rows are models: their names
            line += f"; {which} {rows} x {cols} {view.cell_text(r, c)}{view.interval_or_hint(r, c)}"
        return line + f"; {view.n_images} images"

    def __repr__(self) -> str:
        return f"<vitsee.Result {self.summary()}>"

    def _repr_html_(self) -> str:
        buffer = io.BytesIO()
        self.plot().savefig(buffer, format="png", dpi=NOTEBOOK_DPI)
        image = base64.b64encode(buffer.getvalue()).decode("ascii")
        return (
            f'<div><img src="data:image/png;base64,{image}" alt="{html.escape(self.title, quote=True)}"/>'
            f"<p><code>{html.escape(self.summary())}</code></p></div>"
        )

    def _cell(self, selection) -> tuple[int, int] | None:
        """Returns a selection given by labels or indices as (row, col) indices."""
        if selection is None:
            return None
        row, col = selection
        return self._index(row, self.rows, "row"), self._index(col, self.cols, "column")

    def _index(self, label, labels: list[str], axis: str) -> int:
        if isinstance(label, str):
            if label not in labels:
                raise VitseeError(
                    f"no {axis} '{label}' in {self.spec}: its {axis}s are {', '.join(labels[:8])}"
                    f"{' ...' if len(labels) > 8 else ''}"
                )
            return labels.index(label)
        index = int(label)
        if not 0 <= index < len(labels):
            raise VitseeError(
                f"{axis} {index} is outside {self.spec}: pick a {axis} in 0..{len(labels) - 1} or name one"
            )
        return index


def _optional(module: str, method: str):
    """Returns an optional dependency, or raises the VitseeError naming the install that brings it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise VitseeError(
            f"{method} needs {module}, which is not installed: pip install {module} (or pip install 'vitsee[notebook]')"
        ) from None
