"""What the import contracts (pyproject.toml, [tool.importlinter]; run by scripts/lint.sh) cannot see: inside the
package, a module takes only submodules (the extension ``_C`` among them) from the package root, never a name the
root re-exports (which would hide an upward import behind the facade)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "ember"
SOURCES = sorted(PACKAGE.rglob("*.py"))
SUBMODULES = {"_C"} | {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir() if p.is_dir()}


@pytest.mark.skipif(not SOURCES, reason="the source tree is not beside the tests")
@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_module_takes_only_submodules_from_the_package_root(path):
    if path == PACKAGE / "__init__.py":
        return  # the facade itself
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module == "ember" and node.level == 0:
            names = {alias.name for alias in node.names}
            assert names <= SUBMODULES, f"{path.name}:{node.lineno} imports {names - SUBMODULES} from the package root"
