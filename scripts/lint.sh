#!/usr/bin/env bash
# ember's style checks, as CI runs them (scripts/test.sh) and .pre-commit-config.yaml before a commit:
#   ruff (lint and format) over the Python; mypy, strict for python/ember; the import contracts (lint-imports,
#   pyproject.toml's [tool.importlinter]); clang-format over every C++ file; clang-tidy over csrc/ and python/csrc/
#   (.clang-tidy, warnings as errors). The tools' versions are pinned in scripts/deps.sh.
#   scripts/lint.sh              everything
#   scripts/lint.sh --fast       everything but clang-tidy (seconds instead of minutes)
#   scripts/lint.sh --tidy       clang-tidy only (scripts/test.sh runs it beside the single-threaded tests)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${EMBER_VENV:-.venv}
bin=$PWD/$venv/bin
mode=${1:-all}
cpp_files() { git ls-files 'csrc/*.cpp' 'csrc/*.h' 'csrc/*.inl' 'python/csrc/*.cpp' 'python/csrc/*.h' 'tests/cpp/*.cpp' \
  'tests/cpp/*.h' 'examples/cpp/*.cpp' 'benchmarks/native/*.cpp'; }

if [[ $mode != --tidy ]]; then
  echo "=== lint: ruff ==="
  "$bin/ruff" check python tests benchmarks examples docs/conf.py
  "$bin/ruff" format --check python tests benchmarks examples docs/conf.py
  echo "=== lint: mypy (strict for python/ember) ==="
  (cd python && "$bin/mypy" --config-file ../pyproject.toml ember)
  echo "=== lint: import contracts ==="
  PYTHONPATH=python "$bin/lint-imports" --config pyproject.toml --no-cache | tail -4
  echo "=== lint: clang-format ==="
  # shellcheck disable=SC2046
  "$bin/clang-format" --dry-run --Werror $(cpp_files)
fi

if [[ $mode == all || $mode == --tidy ]]; then
  echo "=== lint: clang-tidy ==="
  # The compile commands of a configured (not built) tree: the flags each file is compiled with, per-ISA ones too.
  cmake -S . -B build/tidy -G Ninja -DCMAKE_BUILD_TYPE=Release -DEMBER_BUILD_PYTHON=ON -DEMBER_BUILD_TESTS=OFF \
    -DPython_EXECUTABLE="$bin/python" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
  # clang-tidy is clang: GCC's omp.h (for the OpenMP backend) is in GCC's own include directory, searched last so
  # that clang's intrinsics headers still come first.
  gcc_include=$(gcc -print-file-name=include)
  "$bin/python" - "$bin/clang-tidy" "${EMBER_TIDY_JOBS:-$(nproc)}" "$gcc_include" <<'PY'
import concurrent.futures, json, subprocess, sys
tidy, jobs, gcc_include = sys.argv[1], int(sys.argv[2]), sys.argv[3]
files = [entry["file"] for entry in json.load(open("build/tidy/compile_commands.json"))]
def run(path):
    command = [tidy, "-p", "build/tidy", "--quiet", f"--extra-arg=-idirafter{gcc_include}", path]
    result = subprocess.run(command, capture_output=True, text=True)
    return result.returncode, result.stdout + result.stderr
failed = 0
with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
    for code, output in pool.map(run, files):
        if code:
            failed += 1
            print(output, end="")
print(f"clang-tidy: {len(files)} files, {failed} with findings")
sys.exit(1 if failed else 0)
PY
fi
