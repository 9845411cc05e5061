#!/usr/bin/env bash
# python/ember/_C.pyi, the type stubs of the binding, is generated from the built module by pybind11-stubgen (the
# binding's argument types name tensors ember._tensor.DLPackTensor, python/csrc/tensor_args.h) and formatted by ruff.
#   scripts/stubs.sh            regenerate python/ember/_C.pyi from the ember installed in the venv
#   scripts/stubs.sh --check    fail if the checked-in stubs differ from the installed module's (CI)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${EMBER_VENV:-.venv}
out=build/stubs
rm -rf "$out"
# From outside the source tree, so that the installed ember is the one described.
(cd build && "../$venv/bin/pybind11-stubgen" ember._C --exit-code -o stubs >/dev/null)
"$venv/bin/ruff" format -q --config pyproject.toml "$out/ember/_C.pyi"
"$venv/bin/ruff" check -q --fix --extend-ignore E501,A002 --config pyproject.toml "$out/ember/_C.pyi"
"$venv/bin/ruff" format -q --config pyproject.toml "$out/ember/_C.pyi"
if [[ "${1:-}" == "--check" ]]; then
  if ! diff -u python/ember/_C.pyi "$out/ember/_C.pyi"; then
    echo "python/ember/_C.pyi does not match the built ember._C: run scripts/stubs.sh and commit the result" >&2
    exit 1
  fi
  echo "python/ember/_C.pyi matches the built ember._C"
else
  cp "$out/ember/_C.pyi" python/ember/_C.pyi
  echo "wrote python/ember/_C.pyi"
fi
