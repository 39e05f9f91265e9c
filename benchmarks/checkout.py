"""Runs another commit's vitsee beside this one, so a benchmark can time old and new interleaved in one run.

    git worktree add /tmp/vitsee-old COMMIT
    # or: mkdir /tmp/vitsee-old && git archive COMMIT | tar -x -C /tmp/vitsee-old
    python benchmarks/extract.py --whole-process --compare-with /tmp/vitsee-old

`env_for(SRC)` returns the environment of a process that imports `vitsee` (and vitsee, vitsee.tui) from the
source tree SRC instead of this checkout's editable install: a folder whose `vitsee` package links SRC/engine's files
and rooms with SRC/tui and SRC/assets beside them (as pyproject's package-dir maps them; a tree from before the rooms,
with engine/public/, is laid out the way it was then), first on PYTHONPATH (the editable install's finder comes after
sys.path, so the folder wins). The same interpreter and packages run both, so only vitsee's code differs.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def env_for(src: Path | None, base: dict[str, str] | None = None) -> dict[str, str]:
    """Returns an environment whose Python imports vitsee from the source tree src (None: this checkout's)."""
    env = dict(os.environ if base is None else base)
    if src is None:
        return env
    src = Path(src).resolve()
    if not (src / "engine" / "__init__.py").is_file():
        raise SystemExit(f"{src} is not a vitsee source tree (no engine/__init__.py): give a checkout of a commit")
    shim = Path(tempfile.mkdtemp(prefix="vitsee-shim-"))
    package = shim / "vitsee"
    if (src / "engine" / "public" / "__init__.py").is_file():  # before the rooms: vitsee was engine/public/
        shutil.copytree(src / "engine" / "public", package)
        links = {"engine": src / "engine"}
    else:
        package.mkdir()
        links = {entry.name: entry for entry in (src / "engine").iterdir() if entry.name != "__pycache__"}
    for name, target in {**links, "tui": src / "tui", "assets": src / "assets"}.items():
        (package / name).symlink_to(target)
    env["PYTHONPATH"] = os.pathsep.join([str(shim), *filter(None, [env.get("PYTHONPATH")])])
    return env
