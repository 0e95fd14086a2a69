#!/usr/bin/env bash
# The services the suite runs against, brought up before it: the local Slurm test cluster (scripts/slurm-up.sh) and
# the PostgreSQL server package the team-store tests start their own server from (tests/services/postgres.py).
# Needs root and apt; elsewhere it says so, and the tests say why they skip. Idempotent: well under a second when
# both are there already. scripts/test.sh runs it first; .ci/run starts it beside the installs.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "not root: no local Slurm or PostgreSQL install; their tests say why they skip" >&2
  exit 0
fi
bash scripts/slurm-up.sh || echo "slurm-up failed: the Slurm tests will say why they skip" >&2
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && command -v apt-get >/dev/null; then
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql; } >/dev/null \
    || echo "installing PostgreSQL failed: the PostgreSQL tests will say why they cannot run" >&2
fi
exit 0
