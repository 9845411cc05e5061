"""Sphinx configuration of ember's documentation site: Markdown pages (MyST) and an API reference generated from
the installed package's docstrings (autodoc + napoleon). Built in CI with warnings as errors:

    .venv/bin/sphinx-build -W --keep-going -b html docs build/docs
"""

from __future__ import annotations

import ember

project = "ember"
author = "the ember developers"
copyright = "2026, the ember developers"  # noqa: A001 - Sphinx's name
release = ember.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3  # "page.md#a-heading" links resolve to the heading

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# Type names of torch and the standard library link to their documentation when an inventory is at hand; the build
# works offline (no inventories), and then they stay plain text.
intersphinx_mapping: dict[str, tuple[str, str | None]] = {}
nitpicky = False

html_theme = "furo"
html_title = f"ember {release}"
html_static_path = ["_static"]
