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
# Test-only: the third-party tracers of the route A tests and recorded fixtures
# (tests/frameworks/_route_a.py, scripts/record_framework_spans.py), pinned exactly: the
# fixtures in tests/testdata/frameworks/ are what these releases emit (versions.json).
# llama-index-llms-ollama only because OpenLLMetry's LlamaIndex instrumentor imports the
# llama_index.llms namespace, which exists once any llama-index-llms-* is installed (the
# usual -openai one would pull openai 2.x, which openai-agents 0.24 cannot share).
declare -A TRACERS=(
  [.venv-fw]="openinference-instrumentation-pydantic-ai==0.1.30 openinference-instrumentation-openai-agents==2.6.0 openinference-instrumentation-langchain==0.1.80 openinference-instrumentation-smolagents==0.1.43 openinference-instrumentation-llama-index==4.6.1 openinference-instrumentation-autogen-agentchat==0.1.22 opentelemetry-instrumentation-openai-agents==0.62.4 opentelemetry-instrumentation-langchain==0.62.4 opentelemetry-instrumentation-llamaindex==0.62.4 llama-index-llms-ollama==0.11.0"
  [.venv-crewai]="openinference-instrumentation-crewai==1.1.21 opentelemetry-instrumentation-crewai==0.62.4"
)
declare -A EXTRAS=(
  [.venv-fw]="otlp,collector,pydantic-ai,openai-agents,langgraph,smolagents,llamaindex,autogen"
  [.venv-crewai]="otlp,collector,crewai"
)
for venv in .venv-fw .venv-crewai; do
  if [[ ! -x $venv/bin/python ]]; then
    "$PY" -m venv "$venv"
  fi
  stamp=$venv/.loopwatch-installed
  if [[ ! -f $stamp || pyproject.toml -nt $stamp || scripts/frameworks.sh -nt $stamp ]]; then
    echo "loopwatch: installing the frameworks into $venv (one to three minutes)"
    "$venv/bin/python" -m pip install -q --upgrade pip 2>&1 | quiet
    "$venv/bin/python" -m pip install -q -e ".[${EXTRAS[$venv]}]" \
      "pytest>=8" "pytest-timeout>=2.3" "httpx>=0.27" ${TRACERS[$venv]} 2>&1 | quiet
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
