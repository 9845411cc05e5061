"""The installed extension is a relocatable wheel: it names no directory of the machine that built it and loads
oneDNN and oneTBB from the environment their PyPI wheels were installed into (scripts/test.sh runs this suite
against the wheel installed into a clean virtual environment)."""

import os
import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

import ember
import ember._C

EXTENSION = Path(ember._C.__file__)
REPOSITORY = Path(__file__).resolve().parents[2]


def _runpath_entries():
    if shutil.which("readelf") is None:
        pytest.skip("readelf (binutils) is not installed")
    dynamic = subprocess.run(["readelf", "-d", str(EXTENSION)], capture_output=True, text=True, check=True).stdout
    entries = []
    for match in re.finditer(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*)\]", dynamic):
        entries.extend(match.group(1).split(":"))
    return entries


def test_the_tested_package_is_installed_not_the_source_tree():
    assert REPOSITORY / "python" not in EXTENSION.resolve().parents


def test_the_extension_names_no_directory_of_the_build_machine():
    entries = _runpath_entries()
    assert entries, "ember._C has no RUNPATH: it would find oneDNN only through LD_LIBRARY_PATH"
    assert all(entry.startswith("$ORIGIN") for entry in entries), entries


def test_onednn_and_onetbb_come_from_the_environment_of_their_wheels():
    # The wheel layout: <prefix>/lib/pythonX.Y/site-packages/ember/_C*.so beside <prefix>/lib/libdnnl.so.3.
    lib = EXTENSION.resolve().parents[3]
    if not (lib / "libdnnl.so.3").exists():
        pytest.skip(f"ember is not installed beside oneDNN's wheel ({lib} has no libdnnl.so.3)")
    with open("/proc/self/maps") as maps:
        loaded = {Path(line.split()[-1]) for line in maps if re.search(r"/lib(dnnl|tbb)\.so", line)}
    for name in ("libdnnl.so.3", "libtbb.so.12"):
        found = [path for path in loaded if path.name.startswith(name)]
        assert found, f"{name} is not loaded"
        assert all(os.path.samefile(path, lib / name) for path in found), (name, found, lib)


def test_the_distribution_metadata_matches_the_package():
    try:
        version = metadata.version("ember")
    except metadata.PackageNotFoundError:
        pytest.skip("ember's dist-info is not on this interpreter's path (the torch 1.13 run borrows the package)")
    assert version == ember.__version__
