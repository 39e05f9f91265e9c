"""No function of engine/ (the package `vitsee`) or tui/ (the app) runs over 80 lines: a longer one is split into
named helpers. The exceptions are named here, each an option list: a Typer command whose signature is its
options, or a public function whose signature is its keyword arguments; even those keep a body (after the signature
and the docstring) within the limit."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 80

# (file, function): long because of their signatures, one typed and documented parameter per option
OPTION_LISTS = {
    ("engine/cli.py", "extract"),  # `vitsee extract`'s options
    ("engine/cli.py", "train"),  # `vitsee train`'s options
    ("engine/cli.py", "analyze"),  # `vitsee analyze`'s options
    ("engine/library/run.py", "train"),  # vitsee.train's keyword arguments, as `vitsee train`'s options
}


def functions(source: str) -> list[tuple[str, int, int, int]]:
    """Returns (name, first line, lines, lines of its body after the signature and the docstring) of every function
    and method in `source`, nested ones included, in the order they start."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]
            start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            found.append((node.name, start, node.end_lineno - node.lineno + 1, node.end_lineno - body[0].lineno + 1))
    return sorted(found, key=lambda f: f[1])


def long_functions(root: Path) -> tuple[list[str], set[tuple[str, str]]]:
    """Returns the functions over LIMIT lines under root's engine/ and tui/ that are not OPTION_LISTS (or whose
    bodies are over it even so), as 'file:line name (N lines)', and the option lists seen over LIMIT."""
    over, seen = [], set()
    for folder in ("engine", "tui"):
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for name, line, lines, body in functions(path.read_text(encoding="utf-8")):
                if lines <= LIMIT:
                    continue
                if (rel, name) in OPTION_LISTS:
                    seen.add((rel, name))
                    if body <= LIMIT:
                        continue
                    over.append(f"{rel}:{line} {name} (its body {body} lines, past its options)")
                else:
                    over.append(f"{rel}:{line} {name} ({lines} lines)")
    return over, seen


def test_no_function_of_the_engine_or_the_app_is_over_80_lines():
    over, _ = long_functions(ROOT)
    assert not over, f"split into named helpers (at most {LIMIT} lines each): " + "; ".join(over)


def test_every_allowed_option_list_is_still_there_and_still_long():
    _, seen = long_functions(ROOT)
    assert seen == OPTION_LISTS, f"drop from OPTION_LISTS what is gone or short now: {sorted(OPTION_LISTS - seen)}"


def test_the_count_sees_a_long_function_a_method_and_a_nested_one(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(LIMIT - 1))
    (tmp_path / "engine").mkdir()
    (tmp_path / "tui").mkdir()
    (tmp_path / "engine" / "long.py").write_text(f"def fits():\n{body}\n\ndef too_long():\n{body}    x = 0\n")
    nested = body.replace("\n    ", "\n        ")
    (tmp_path / "tui" / "deep.py").write_text(
        f"class A:\n    def method(self):\n    {nested}        y = 1\n        z = 2\n\n"
        f"def outer():\n    def inner():\n    {nested}        y = 1\n        z = 2\n    return inner\n"
    )
    over, _ = long_functions(tmp_path)
    assert [entry.split(" (")[0] for entry in over] == [
        "engine/long.py:83 too_long",
        "tui/deep.py:2 method",
        "tui/deep.py:85 outer",
        "tui/deep.py:86 inner",
    ]
