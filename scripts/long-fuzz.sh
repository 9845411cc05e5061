#!/usr/bin/env bash
# The long fuzz of the property suite (docs/reliability.md): two pytest processes, one per core, each repeating its
# property files with fresh random seeds until MINUTES have passed, then finishing its round; prints the inputs
# each property passed, summed over the rounds, and exits non-zero if any round failed.
#   scripts/long-fuzz.sh [MINUTES (60)] [EXAMPLES_FUNCTIONAL (8000)] [EXAMPLES_OTHERS (2000)]
# Logs: build/long-fuzz-{functional,others}.log. Runs the ember installed in the virtual environment
# (scripts/build.sh); a failure prints its shrunk input and a @reproduce_failure line.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${EMBER_VENV:-.venv}
minutes=${1:-60}
hardening=../tests/python/hardening
mkdir -p build

rounds() {  # name examples files...
  local name=$1 examples=$2 start failed=0
  shift 2
  start=$(date +%s)
  : > "build/long-fuzz-$name.log"
  while (( $(date +%s) - start < minutes * 60 )); do
    (cd build && EMBER_FUZZ_EXAMPLES=$examples "../$venv/bin/python" -m pytest -c ../pyproject.toml --rootdir .. \
      -p no:cacheprovider -q --hypothesis-show-statistics "$@") >> "build/long-fuzz-$name.log" 2>&1 || failed=1
  done
  echo "$name: $(( ($(date +%s) - start) / 60 )) min" >> "build/long-fuzz-$name.log"
  return $failed
}

status=0
rounds functional "${2:-8000}" $hardening/test_properties_functional.py $hardening/test_properties_devices.py &
first=$!
rounds others "${3:-2000}" $hardening/test_properties_optim.py $hardening/test_properties_modules.py \
  $hardening/test_properties_models.py &
second=$!
wait $first || status=1
wait $second || status=1

"$venv/bin/python" - build/long-fuzz-functional.log build/long-fuzz-others.log <<'PY'
import re, sys
from collections import Counter
passed = Counter()
for path in sys.argv[1:]:
    test = None
    for line in open(path):
        header = re.match(r"^tests/python/hardening/\S+::(\S+):$", line.strip())
        if header:
            test = header.group(1)
        counts = re.search(r"- (\d+) passing, (\d+) failing", line)
        if counts and test:
            passed[test] += int(counts.group(1))
        if re.match(r"^\w+: \d+ min$", line.strip()):
            print(line.strip())
for test, n in sorted(passed.items()):
    print(f"{n:>9}  {test}")
PY
[[ $status == 0 ]] && echo "long fuzz: nothing failed" || echo "long fuzz: a round failed (see build/long-fuzz-*.log)"
exit $status
