"""One version: the package's metadata (python/pyproject.toml) equals CMakeLists.txt's project version,
which the leanmoe CLI prints."""
import pathlib
import re

import leanmoe

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_python_version_is_the_cmake_project_version():
    cmake = (ROOT / "CMakeLists.txt").read_text()
    m = re.search(r"project\(leanmoe\b[^)]*\bVERSION\s+([0-9.]+)", cmake)
    assert m, "CMakeLists.txt declares no project version"
    assert leanmoe.__version__ == m.group(1)
