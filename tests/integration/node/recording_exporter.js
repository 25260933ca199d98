// A span exporter that records the result of every export of the exporter it wraps.
// The batch span processor swallows export failures, so a sender that must exit
// non-zero on any failed export checks `results` after shutdown.
'use strict';

function recording(inner) {
  const results = [];
  const exporter = {
    export(batch, done) {
      inner.export(batch, (result) => {
        results.push(result);
        done(result);
      });
    },
    shutdown: () => inner.shutdown(),
    forceFlush: () => (inner.forceFlush ? inner.forceFlush() : Promise.resolve()),
  };
  return { exporter, results };
}

module.exports = { recording };
