#!/usr/bin/env node
// A non-Python OTLP/HTTP client for the collector's integration tests.
//
// Exports one third-party agent run written with the GenAI semantic conventions: an
// `invoke_agent support` span and N identical `execute_tool lookup_order` children (same
// arguments, same result), so only the collector's server-side detection can see the loop.
//
// Usage: node send_spans.js URL [--mode sdk|raw-chunked] [--gzip] [--calls N]
//                               [--agent NAME] [--trace-id HEX32] [--token TOKEN]
//
//   --mode sdk          (default) the OpenTelemetry JS SDK and its OTLP/HTTP JSON exporter
//                       (`@opentelemetry/exporter-trace-otlp-http`); it streams the body,
//                       so Node sends it chunked, without Content-Length.
//   --mode raw-chunked  one OTLP/JSON request built by hand and written in several chunks
//                       with Node's `http` module (`Transfer-Encoding: chunked`); ids are
//                       known in advance (`--trace-id`), to check hex id decoding.
//
// Prints one JSON line: {"trace_id", "run_span_id", "tool_spans", "mode", "status"}.
// Exits 0 only when every export was acknowledged with a 2xx; 1 otherwise (reason on stderr).
'use strict';

const crypto = require('node:crypto');
const http = require('node:http');

const TOOL = 'lookup_order';
const ARGUMENTS = JSON.stringify({ order_id: 'A-1001', fields: ['status', 'eta'] });
const RESULT = JSON.stringify({ order_id: 'A-1001', status: 'in_transit', eta: null });

function parseArgs(argv) {
  const opts = { mode: 'sdk', gzip: false, calls: 5, agent: 'support', traceId: null, token: null };
  const rest = argv.slice(2);
  if (rest.length === 0 || rest[0].startsWith('--')) {
    throw new Error('usage: node send_spans.js URL [--mode sdk|raw-chunked] [--gzip] [--calls N]');
  }
  opts.url = rest.shift();
  while (rest.length) {
    const flag = rest.shift();
    if (flag === '--gzip') opts.gzip = true;
    else if (flag === '--mode') opts.mode = rest.shift();
    else if (flag === '--calls') opts.calls = Number.parseInt(rest.shift(), 10);
    else if (flag === '--agent') opts.agent = rest.shift();
    else if (flag === '--trace-id') opts.traceId = rest.shift();
    else if (flag === '--token') opts.token = rest.shift();
    else throw new Error(`unknown option ${flag}`);
  }
  if (!['sdk', 'raw-chunked'].includes(opts.mode)) throw new Error(`unknown mode ${opts.mode}`);
  if (!(opts.calls >= 1)) throw new Error('--calls must be >= 1');
  if (opts.traceId !== null && !/^[0-9a-f]{32}$/.test(opts.traceId)) {
    throw new Error('--trace-id must be 32 lowercase hex characters');
  }
  return opts;
}

// Times in ms since the epoch: the run spans [t0, t0 + 20 * calls + 10]; tool i starts at
// t0 + 20 * i + 5 and lasts 10 ms, so start-time order is call order.
function plan(opts) {
  const t0 = Date.now() - 60_000;
  const tools = [];
  for (let i = 0; i < opts.calls; i += 1) {
    const start = t0 + 20 * i + 5;
    tools.push({
      name: `execute_tool ${TOOL}`,
      start,
      end: start + 10,
      attributes: {
        'gen_ai.operation.name': 'execute_tool',
        'gen_ai.tool.name': TOOL,
        'gen_ai.tool.type': 'function',
        'gen_ai.tool.call.id': `call_${i + 1}`,
        'gen_ai.tool.call.arguments': ARGUMENTS,
        'gen_ai.tool.call.result': RESULT,
      },
    });
  }
  const run = {
    name: `invoke_agent ${opts.agent}`,
    start: t0,
    end: t0 + 20 * opts.calls + 10,
    attributes: {
      'gen_ai.operation.name': 'invoke_agent',
      'gen_ai.agent.name': opts.agent,
      'gen_ai.provider.name': 'openai',
    },
  };
  return { run, tools };
}

function headers(opts) {
  return opts.token ? { Authorization: `Bearer ${opts.token}` } : {};
}

async function sendWithSdk(opts, spans) {
  const api = require('@opentelemetry/api');
  const { BasicTracerProvider, BatchSpanProcessor } = require('@opentelemetry/sdk-trace-base');
  const { resourceFromAttributes } = require('@opentelemetry/resources');
  const { OTLPTraceExporter } = require('@opentelemetry/exporter-trace-otlp-http');

  const inner = new OTLPTraceExporter({
    url: opts.url,
    headers: headers(opts),
    compression: opts.gzip ? 'gzip' : 'none',
    timeoutMillis: 10_000,
  });
  // The batch processor swallows export failures; record every result to exit non-zero.
  const { exporter, results } = require('./recording_exporter.js').recording(inner);
  const provider = new BasicTracerProvider({
    resource: resourceFromAttributes({ 'service.name': 'node-support-agent' }),
    spanProcessors: [new BatchSpanProcessor(exporter, { scheduledDelayMillis: 100 })],
  });
  const tracer = provider.getTracer('loopwatch-integration-node', '0.0.0');
  // No context manager is registered, so the parent is passed explicitly.
  const runSpan = tracer.startSpan(spans.run.name, {
    kind: api.SpanKind.INTERNAL,
    startTime: spans.run.start,
    attributes: spans.run.attributes,
  });
  const parent = api.trace.setSpan(api.context.active(), runSpan);
  for (const tool of spans.tools) {
    const span = tracer.startSpan(
      tool.name,
      { kind: api.SpanKind.INTERNAL, startTime: tool.start, attributes: tool.attributes },
      parent,
    );
    span.end(tool.end);
  }
  runSpan.end(spans.run.end);
  await provider.shutdown();
  const failed = results.filter((r) => r.code !== 0);
  if (results.length === 0 || failed.length) {
    const reason = failed.length ? String(failed[0].error) : 'nothing was exported';
    throw new Error(`export failed: ${reason}`);
  }
  const ctx = runSpan.spanContext();
  return { trace_id: ctx.traceId, run_span_id: ctx.spanId, status: 200 };
}

function otlpValue(value) {
  if (typeof value === 'string') return { stringValue: value };
  if (typeof value === 'boolean') return { boolValue: value };
  if (Number.isInteger(value)) return { intValue: String(value) };
  return { doubleValue: value };
}

function otlpSpan(traceId, spanId, parentSpanId, span) {
  const ns = (ms) => `${BigInt(ms) * 1_000_000n}`;
  return {
    traceId,
    spanId,
    ...(parentSpanId ? { parentSpanId } : {}),
    name: span.name,
    kind: 1, // SPAN_KIND_INTERNAL
    startTimeUnixNano: ns(span.start),
    endTimeUnixNano: ns(span.end),
    attributes: Object.entries(span.attributes).map(([key, v]) => ({ key, value: otlpValue(v) })),
    status: {},
  };
}

function sendRawChunked(opts, spans) {
  const traceId = opts.traceId || crypto.randomBytes(16).toString('hex');
  const runSpanId = crypto.randomBytes(8).toString('hex');
  const body = Buffer.from(
    JSON.stringify({
      resourceSpans: [
        {
          resource: {
            attributes: [{ key: 'service.name', value: { stringValue: 'node-raw-client' } }],
          },
          scopeSpans: [
            {
              scope: { name: 'loopwatch-integration-node-raw', version: '0.0.0' },
              spans: [
                ...spans.tools.map((t) =>
                  otlpSpan(traceId, crypto.randomBytes(8).toString('hex'), runSpanId, t),
                ),
                otlpSpan(traceId, runSpanId, null, spans.run),
              ],
            },
          ],
        },
      ],
    }),
  );
  return new Promise((resolve, reject) => {
    const req = http.request(
      opts.url,
      {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', ...headers(opts) },
      },
      (res) => {
        const parts = [];
        res.on('data', (c) => parts.push(c));
        res.on('end', () => {
          const text = Buffer.concat(parts).toString();
          if (res.statusCode < 200 || res.statusCode > 299) {
            reject(new Error(`HTTP ${res.statusCode}: ${text.slice(0, 300)}`));
            return;
          }
          resolve({ trace_id: traceId, run_span_id: runSpanId, status: res.statusCode, body: text });
        });
      },
    );
    req.on('error', reject);
    // No Content-Length: Node frames each write as one chunk (Transfer-Encoding: chunked).
    const cuts = [0, Math.floor(body.length / 3), Math.floor((2 * body.length) / 3), body.length];
    let i = 0;
    const next = () => {
      if (i === cuts.length - 1) {
        req.end();
        return;
      }
      req.write(body.subarray(cuts[i], cuts[i + 1]));
      i += 1;
      setTimeout(next, 20);
    };
    next();
  });
}

async function main() {
  const opts = parseArgs(process.argv);
  const spans = plan(opts);
  const sent =
    opts.mode === 'sdk' ? await sendWithSdk(opts, spans) : await sendRawChunked(opts, spans);
  process.stdout.write(
    `${JSON.stringify({ ...sent, tool_spans: spans.tools.length, mode: opts.mode })}\n`,
  );
}

main().catch((err) => {
  process.stderr.write(`send_spans.js: ${err && err.message ? err.message : err}\n`);
  process.exit(1);
});
