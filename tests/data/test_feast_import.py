"""Feast is imported through `pipelines.features.import_feast` only: there its methods are not wrapped by
typeguard, whose wrapping parses and compiles a module again for each method (its docstring)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# feature_repo/ holds the Feast repository's own files: load_definitions imports feast before them.
PRODUCT = ("pipelines", "training", "dags", "plugins", "providers", "clients")


def direct_imports_of_feast(path: Path) -> list[int]:
    """The lines of `path` that import feast at run time (an import under `if TYPE_CHECKING` is not)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for node in ast.walk(block)
    }
    lines = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        if any(name == "feast" or name.startswith("feast.") for name in names):
            lines.append(node.lineno)
    return lines


def test_no_module_of_the_product_imports_feast_but_through_import_feast() -> None:
    found = {
        str(path.relative_to(ROOT)): lines
        for folder in PRODUCT
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (lines := direct_imports_of_feast(path))
    }
    assert found == {}, f"import feast with pipelines.features.import_feast(): {found}"


CHECK = """
import json, typeguard
from pipelines import features
checked = typeguard.typechecked
feast = features.import_feast()
init = feast.FeatureView.__init__.__code__
print(json.dumps({"restored": typeguard.typechecked is checked, "wrapped": "TypeCheckMemo" in init.co_names}))
"""


def test_feast_s_methods_are_not_wrapped_and_typeguard_is_left_as_it_was() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"restored": True, "wrapped": False}
