"""Fleet mode: many collectors ship finished runs to one DuckLake (docs/lake.md).

- :mod:`.connect`: load the DuckLake and PostgreSQL extensions from files (never the
  network) and attach the lake as ``lake``;
- :mod:`.schema`: the lake's tables, the documented contract.
"""
