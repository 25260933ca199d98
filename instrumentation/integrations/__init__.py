"""loopwatch.instrumentation.integrations: the guard inside the agent frameworks people run.

One module per framework, each behind its own extra that pins the supported releases
(``pip install 'loopwatch[pydantic-ai]'``); importing a module whose framework is not
installed raises ImportError naming the extra. Every adapter does the same four things
the framework's way:

- checks model turns before each model request and charges the tokens (and the cost,
  from the framework's usage objects or the genai-prices table) after it;
- guards every tool call, the framework's own tool objects included, sync and async;
- ends the run the framework's clean way when the guard stops it, and hands the caller
  the framework's normal result or exception plus the loopwatch ``Outcome``;
- maps the framework's own limits onto the stop-reason taxonomy.

docs/frameworks.md gives the one-line setup of each, the versions tested and what each
route sees.
"""
