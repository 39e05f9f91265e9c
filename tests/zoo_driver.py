"""`vitsee ARGS` with the zoo's tiny models registered in timm (tests/zoo_models.py), for tests that run extraction in
a process of its own (to kill it).

    python tests/zoo_driver.py extract STORE --model deit_zoo_tiny@random:0 ...
"""

from __future__ import annotations

import sys

from zoo_models import zoo_models

if __name__ == "__main__":
    zoo_models()
    from vitsee.cli import main

    sys.argv = ["vitsee", *sys.argv[1:]]
    main()
