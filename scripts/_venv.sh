# Sourced by the scripts: make sure .venv exists with the project and its dev
# tools installed, and that every package it shares with the images is at the
# version images/artifacts.lock.json locks (pip constraints made from the lock),
# so unit tests and benchmarks run what the images run. The venv is updated when
# pyproject.toml or the lock's Python packages change.
# IOT_STACK_VENV_UNLOCKED=1 installs without the constraints, once: the way out
# when pyproject.toml and the lock disagree and `scripts/artifacts lock` must run.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${IOT_STACK_VENV:-$here/.venv}
source "$here/scripts/_apt.sh"
# Python 3.11 or newer with a working venv module (Debian splits ensurepip into python3-venv).
if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null \
   || ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
  apt_install "the Python venv (3.11 or newer)" python3 python3-venv || return 1 2>/dev/null || exit 1
fi
# The constraints need only the standard library, so the host's python3 makes them.
if ! constraints=$(cd "$here" && python3 -m tooling.build.artifacts constraints); then
  echo "[venv] cannot make pip constraints from images/artifacts.lock.json (see above)" >&2
  return 1
fi
stamp="$venv/.inputs.sha256"
want=$( { sha256sum < "$here/pyproject.toml"; printf '%s\n' "$constraints" | sha256sum; } | sha256sum | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[venv] preparing $venv (packages shared with the images at their locked versions)" >&2
  python3 -m venv "$venv"
  rm -f "$stamp" "$venv/.pyproject.sha256"
  printf '%s\n' "$constraints" > "$venv/constraints.txt"
  "$venv/bin/pip" install -q --disable-pip-version-check --upgrade pip setuptools wheel
  if [ -n "${IOT_STACK_VENV_UNLOCKED:-}" ]; then
    echo "[venv] IOT_STACK_VENV_UNLOCKED: installing without the lock's constraints" >&2
    "$venv/bin/pip" install -q --disable-pip-version-check -e "$here[dev,deploy]"
  else
    if ! "$venv/bin/pip" install -q --disable-pip-version-check -c "$venv/constraints.txt" -e "$here[dev,deploy]"; then
      echo "[venv] pyproject.toml and images/artifacts.lock.json disagree (constraints: $venv/constraints.txt)." >&2
      echo "[venv] Fix the pin in images/versions.toml, then: IOT_STACK_VENV_UNLOCKED=1 scripts/artifacts lock" >&2
      return 1
    fi
    # Packages installed earlier, e.g. the spark stack (`scripts/artifacts pip-install
    # spark`), go to their locked versions too; then every shared package is checked.
    if ! (cd "$here" && "$venv/bin/python" -m tooling.build.artifacts check-env --sync); then
      return 1
    fi
    echo "$want" > "$stamp"
  fi
fi
PY="$venv/bin/python"
export PATH="$venv/bin:$PATH"
