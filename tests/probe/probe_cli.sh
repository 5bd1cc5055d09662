#!/usr/bin/env bash
# probe_cli.sh <expected exit code> <text the output must contain> <probe> [args...]
# Runs a railyard-rdma-probe binary and checks both.
set -u
want_rc=$1 want_text=$2
shift 2
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [[ $rc -ne $want_rc ]]; then
  echo "probe_cli.sh: exit code $rc; expected $want_rc"
  exit 1
fi
if [[ $out != *"$want_text"* ]]; then
  echo "probe_cli.sh: the output lacks '$want_text'"
  exit 1
fi
