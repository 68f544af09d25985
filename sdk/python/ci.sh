#!/usr/bin/env bash
# The Python SDK's CI step (tests/run.sh runs it after `cargo build --workspace --bins`):
# builds the wheel once with maturin in the dev profile, sharing target/ with cargo (only pyo3
# and agen-python compile again), installs it in target/py-sdk/venv with the pinned tools of
# requirements.txt, then runs `mypy --strict` and pytest (a real `agen up` with the fake model,
# target/debug/agen).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$root/target/py-sdk"
venv="$out/venv"
mkdir -p "$out"

stamp="$out/.installed"
want="$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)"
# A venv cannot move (its scripts name the python of the folder it was made in).
if [ ! -x "$venv/bin/python" ] || [ "$(head -n1 "$venv/bin/pytest" 2>/dev/null)" != "#!$venv/bin/python" ] \
   || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$here/requirements.txt"
  echo "$want" > "$stamp"
fi

rm -rf "$out/wheels"
(cd "$here" && CARGO_INCREMENTAL=0 "$venv/bin/maturin" build --profile dev --locked \
  --target-dir "$root/target" --out "$out/wheels" --quiet)
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$out"/wheels/agen-*.whl

cd "$here"
"$venv/bin/mypy" --strict --no-incremental
AGEN_BIN="$root/target/debug/agen" "$venv/bin/python" -m pytest -q -p no:cacheprovider
