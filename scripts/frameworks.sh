#!/usr/bin/env bash
# The agent frameworks' live tests (tests/frameworks/), each framework at its pinned
# release, in environments of their own: crewai 1.15 needs openai 2.x and openai-agents
# 0.24 needs openai 3.x, so CrewAI cannot share one with the others.
#   .venv-fw      pydantic-ai, openai-agents, langgraph, smolagents, llamaindex, autogen
#   .venv-crewai  crewai
# Usage: bash scripts/frameworks.sh [pytest args...]   (set up, then run the tests)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
quiet() { grep -vE "Location 'file:///opt/pypi|^\s*$|BuildBackendWarning|!!|Editable install|folders with the same name|with strategy, WheelFile|^\s{2,}" || true; }
declare -A EXTRAS=(
  [.venv-fw]="otlp,collector,pydantic-ai,openai-agents,langgraph,smolagents,llamaindex,autogen"
  [.venv-crewai]="otlp,collector,crewai"
)
for venv in .venv-fw .venv-crewai; do
  if [[ ! -x $venv/bin/python ]]; then
    "$PY" -m venv "$venv"
  fi
  stamp=$venv/.loopwatch-installed
  if [[ ! -f $stamp || pyproject.toml -nt $stamp ]]; then
    echo "loopwatch: installing the frameworks into $venv (one to three minutes)"
    "$venv/bin/python" -m pip install -q --upgrade pip 2>&1 | quiet
    "$venv/bin/python" -m pip install -q -e ".[${EXTRAS[$venv]}]" \
      "pytest>=8" "pytest-timeout>=2.3" "httpx>=0.27" 2>&1 | quiet
    touch "$stamp"
  fi
done
# A framework that fails to import would skip its whole test module: refuse that here.
.venv-fw/bin/python -c "import pydantic_ai, agents, langgraph, langchain_core, smolagents, \
llama_index.core, autogen_agentchat, autogen_ext.models.replay, genai_prices"
.venv-crewai/bin/python -c "import crewai, genai_prices"
echo "== frameworks (.venv-fw)"
.venv-fw/bin/python -m pytest -p no:cacheprovider --disable-warnings tests/frameworks "$@"
echo "== frameworks (.venv-crewai)"
.venv-crewai/bin/python -m pytest -p no:cacheprovider --disable-warnings tests/frameworks "$@"
