"""loopwatch collector: OTLP in, secrets out, stops stored and counted (DESIGN section 5)."""
