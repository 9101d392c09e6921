#!/usr/bin/env bash
# run_pytest.sh PYTHON REPORT.xml TESTDIR [pytest args]: pytest under PYTHON, or exit 77 (SKIP)
# saying what that Python lacks.
py=$1 report=$2 dir=$3; shift 3
if ! missing=$("$py" -c '
import importlib.util as u
print(" ".join(m for m in ("torch", "numpy", "pytest") if u.find_spec(m) is None))' 2>&1); then
  echo "SKIP: cannot run $py: $missing"; exit 77
fi
if [ -n "$missing" ]; then echo "SKIP: $py has no $missing"; exit 77; fi
"$py" -c 'import torch; print("torch", torch.__version__, "at", torch.__file__)'
exec "$py" -m pytest -q -p no:cacheprovider --junitxml="$report" "$dir" "$@"
