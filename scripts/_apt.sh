# Sourced by the scripts: `apt_install WHY PACKAGE...` installs Debian packages that
# are missing, running `apt-get update` once first (a fresh machine has no lists).
# Needs root; the message names the packages and why they are needed.
apt_install() {
  local why=$1; shift
  local missing=() pkg
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    printf '[apt] error: %s needs Debian packages %s; run as root (sudo) or install them first\n' \
      "$why" "${missing[*]}" >&2
    return 1
  fi
  command -v apt-get >/dev/null 2>&1 || {
    printf '[apt] error: %s needs %s and there is no apt-get; install them for your OS\n' "$why" "${missing[*]}" >&2
    return 1; }
  export DEBIAN_FRONTEND=noninteractive
  if [ -z "${IOT_STACK_APT_UPDATED:-}" ]; then
    printf '[apt] apt-get update\n' >&2
    apt-get update -qq >/dev/null || { printf '[apt] error: apt-get update failed; check /etc/apt/sources.list*\n' >&2; return 1; }
    export IOT_STACK_APT_UPDATED=1
  fi
  printf '[apt] installing %s (%s)\n' "${missing[*]}" "$why" >&2
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || { printf '[apt] error: apt-get install %s failed\n' "${missing[*]}" >&2; return 1; }
}
