# Sourced by the scripts: make sure .venv exists with the project and its dev
# tools installed; reinstall only when pyproject.toml changes.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${IOT_STACK_VENV:-$here/.venv}
source "$here/scripts/_apt.sh"
# Python 3.11 or newer with a working venv module (Debian splits ensurepip into python3-venv).
if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null \
   || ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
  apt_install "the Python venv (3.11 or newer)" python3 python3-venv || return 1 2>/dev/null || exit 1
fi
stamp="$venv/.pyproject.sha256"
want=$(sha256sum "$here/pyproject.toml" | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[venv] preparing $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip setuptools wheel
  "$venv/bin/pip" install -q -e "$here[dev,deploy]"
  echo "$want" > "$stamp"
fi
PY="$venv/bin/python"
export PATH="$venv/bin:$PATH"
