#!/usr/bin/env bash
# Install mini-swe-agent (a real coding agent no one here wrote) into its own virtualenv,
# so its litellm / openai / pydantic pins never touch the project's environment.
#
# The virtualenv is ~/.cache/agspec/venvs/mini-swe-agent-<version> ($AGSPEC_CACHE moves
# it). A second run finds it complete and does nothing (a second or so). A cut install
# never counts as installed (see below).
# The last line printed is the venv's python, for scripts to capture:
#     PY=$(scripts/install_agent.sh | tail -n1)
#
# Usage: scripts/install_agent.sh [BASE_PYTHON]   (default: $PYTHON or python3)
set -euo pipefail
BASE_PY="${1:-${PYTHON:-python3}}"
VERSION="2.4.6"
VENV="${AGSPEC_CACHE:-$HOME/.cache/agspec}/venvs/mini-swe-agent-$VERSION"

# A venv counts as installed only once its marker is written, after the import check; a
# cut install lacks the marker and is rebuilt from scratch (a venv's scripts hard-code
# its path, so it is built in place rather than renamed into place).
if [ -x "$VENV/bin/python" ] && [ -f "$VENV/.agspec-complete" ]; then
  echo "mini-swe-agent $VERSION already installed in $VENV" >&2
  echo "$VENV/bin/python"
  exit 0
fi

echo "installing mini-swe-agent $VERSION into $VENV (about a minute)" >&2
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$BASE_PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "mini-swe-agent==$VERSION" >&2
"$VENV/bin/python" -c "import minisweagent; print('mini-swe-agent', minisweagent.__version__, 'installed')" >&2
touch "$VENV/.agspec-complete"
echo "$VENV/bin/python"
