#!/usr/bin/env bash
# The Debian packages `make test` needs, installed when missing (as root, `apt-get update` first),
# otherwise one line naming them and the command. Called by `make test` and `make debian-packages`.
#   libfaketime (faketime): a process whose wall clock runs 10 minutes ahead (tests/test_*processes*)
#   gdb: stops a PostgreSQL backend between its clock read and pg_stat_activity (test_horizon_window)
#   unixODBC + the PostgreSQL and MariaDB ODBC drivers: the pyodbc path (tests/test_pyodbc_path.py)
#   the PostgreSQL JDBC jar: spark.read.jdbc in the backfill benchmark
set -euo pipefail
packages=("$@")
if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "debian-packages: not a Debian/Ubuntu machine (no dpkg-query); install the equivalents of: ${packages[*]}" >&2
  exit 0
fi
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done
((${#missing[@]})) || exit 0
command=(apt-get install -y -qq "${missing[@]}")
if [[ $(id -u) -ne 0 ]]; then
  echo "make test needs these Debian packages: ${missing[*]}; install them with: sudo apt-get update && sudo ${command[*]}" >&2
  exit 1
fi
echo "debian-packages: installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${command[@]}" >/dev/null
