#!/usr/bin/env node
// Canary sweep client: exports spans described by a JSON plan with the OpenTelemetry JS
// SDK's OTLP/HTTP JSON exporter (the second real client of the collector).
//
// Usage: NODE_PATH=tests/integration/node/node_modules node node_canaries.js URL PLAN.json
//
// PLAN: {"resource": {k: v}, "scope": {"name", "version"}, "spans": [{"name",
//   "attributes": {k: v}, "events": [{"name", "attributes"}], "linkAttributes": {k: v},
//   "status": "error message"}]}. Every span gets a link to the first span (with
//   linkAttributes). Prints {"exports": n, "spans": n}; exits 1 if an export failed.
'use strict';

const fs = require('node:fs');

async function main() {
  const [url, planPath] = process.argv.slice(2);
  const plan = JSON.parse(fs.readFileSync(planPath, 'utf8'));
  const api = require('@opentelemetry/api');
  const { BasicTracerProvider, BatchSpanProcessor } = require('@opentelemetry/sdk-trace-base');
  const { resourceFromAttributes } = require('@opentelemetry/resources');
  const { OTLPTraceExporter } = require('@opentelemetry/exporter-trace-otlp-http');

  const inner = new OTLPTraceExporter({ url, timeoutMillis: 10_000 });
  const { exporter, results } = require('../integration/node/recording_exporter.js').recording(inner);
  const provider = new BasicTracerProvider({
    resource: resourceFromAttributes(plan.resource),
    spanProcessors: [
      new BatchSpanProcessor(exporter, { scheduledDelayMillis: 60_000, maxExportBatchSize: 512 }),
    ],
  });
  const tracer = provider.getTracer(plan.scope.name, plan.scope.version);
  let first = null;
  for (const spec of plan.spans) {
    const links = first
      ? [{ context: first.spanContext(), attributes: spec.linkAttributes || {} }]
      : [];
    const span = tracer.startSpan(spec.name, {
      kind: api.SpanKind.INTERNAL,
      attributes: spec.attributes || {},
      links,
    });
    for (const event of spec.events || []) span.addEvent(event.name, event.attributes || {});
    if (spec.status) span.setStatus({ code: api.SpanStatusCode.ERROR, message: spec.status });
    span.end();
    if (!first) first = span;
  }
  await provider.shutdown();
  const failed = results.filter((r) => r.code !== 0);
  if (results.length === 0 || failed.length) {
    throw new Error(`export failed: ${failed.length ? String(failed[0].error) : 'nothing exported'}`);
  }
  process.stdout.write(`${JSON.stringify({ exports: results.length, spans: plan.spans.length })}\n`);
}

main().catch((error) => {
  process.stderr.write(`${error.stack || error}\n`);
  process.exit(1);
});
