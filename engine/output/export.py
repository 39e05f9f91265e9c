"""Writing a view to a file: a figure (.png, engine/output/figures.py), its numbers (.json) or a table (.csv).

Apart from engine/analyses/views.py so that views never import the figures that draw them."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from vitsee.output.colormap import check_colormap
from vitsee.errors import VitseeError, brief
from vitsee.output.figures import save_png
from vitsee.analyses.views import View, to_jsonable

EXPORT_SUFFIXES = (".png", ".json", ".csv")


def check_export(out: str | Path, cmap: str = "viridis") -> Path:
    """Returns the export path once a view can be written there (a known suffix, not a folder, in a folder
    that takes new files) with a known colormap; else raises the VitseeError that says so. `export` checks
    this before it computes a view, so a refused export leaves the store as it was."""
    out = Path(out)
    check_colormap(cmap)
    if out.is_dir():
        raise VitseeError(f"--out {out} is a folder: give a file name in it, e.g. {out / 'view.png'}")
    if out.suffix.lower() not in EXPORT_SUFFIXES:
        raise VitseeError(f"cannot export to '{out.name}': use a .png, .json or .csv file name")
    check_out_folder(out)
    return out


def check_out_folder(out: Path) -> None:
    """Raises the VitseeError naming the way out unless the folder of `--out FILE` is there and takes new files:
    the one rule of `vitsee export` and `vitsee-tui --snapshot` (neither makes a folder a typo named)."""
    parent = out.parent
    if not parent.exists():
        raise VitseeError(f"folder {parent} does not exist: create it (mkdir -p {parent}) or choose another --out")
    if not parent.is_dir():
        raise VitseeError(f"--out {out}: {parent} is a file, not a folder: choose another --out")
    try:  # the one sure test of a folder's permissions (and of a read-only disk) is to make a file in it
        with tempfile.NamedTemporaryFile(dir=parent, prefix=f".{out.name}.", suffix=".check"):
            pass
    except OSError as exc:
        raise VitseeError(
            f"cannot write into folder {parent} ({brief(exc)}): check its permissions, or choose another --out"
        ) from None


def write_view(view: View, out: str | Path, selection: tuple[int, int] | None = None, cmap: str = "viridis") -> Path:
    """Writes the view to .png (a figure), .json or .csv, by the file's extension; returns the path.

    The file is written under a temporary name and renamed into place, so a failed export leaves no
    partial file (and an older export at that path stays whole)."""
    out = check_export(out, cmap)
    suffix = out.suffix.lower()
    tmp = out.with_name(f".{out.stem}.writing-{os.getpid()}{out.suffix}")
    try:
        if suffix == ".json":
            payload = view.to_json()
            if selection is not None:
                payload["selection"] = {
                    "row": selection[0],
                    "col": selection[1],
                    "row_label": view.rows[selection[0]],
                    "col_label": view.cols[selection[1]],
                    "value": to_jsonable(view.matrix[selection]),
                }
                for name in ("ci_low", "ci_high", "p_value"):
                    if getattr(view, name) is not None:
                        payload["selection"][name] = to_jsonable(getattr(view, name)[selection])
            tmp.write_text(json.dumps(payload, indent=1))
        elif suffix == ".csv":
            tmp.write_text(view.to_csv())
        else:
            save_png(view, tmp, selection=selection, cmap=cmap)
        os.replace(tmp, out)
    except OSError as exc:
        raise VitseeError(f"cannot write {out} ({brief(exc)}): check the folder's permissions and free space") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return out
