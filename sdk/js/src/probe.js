// A check: probe({ name, config, check(req) { ... } }). Export it from the
// component's entry module with `@sonde/sdk/component`:
//
//   export const { describe, check } = exportProbe(myProbe);

import { Outcome, ProbeError, Request } from './core.js';

/**
 * Defines a probe. `check(req)` returns an Outcome (or throws a
 * ProbeError); `config` is a config.define(...) spec: req.config() returns
 * the typed config and describe() publishes its schema.
 */
export function probe({ name, version = '0.1.0', vendor = '', description = '', config = undefined, capabilities = [], check }) {
  if (typeof check !== 'function') throw new TypeError('a probe needs check(req)');
  if (!name) throw new TypeError('a probe needs a name');
  return Object.freeze({ name, version, vendor, description, config, capabilities, check });
}

/** Who the plugin is: {name, version, vendor, description, configSchema, capabilities}. */
export function describe(p) {
  return {
    name: p.name,
    version: p.version,
    vendor: p.vendor,
    description: p.description,
    configSchema: p.config ? p.config.schema(p.name) : undefined,
    capabilities: [...p.capabilities],
  };
}

function location(e) {
  const frame = String(e?.stack ?? '').split('\n').find((l) => l.trim());
  return frame ? ` (at ${frame.trim().replace(/^at /, '')})` : '';
}

/**
 * Runs one check as the component does: typed config attached to `req`,
 * an Outcome back, a ProbeError thrown as it is, any other exception (a
 * bug) as ProbeError('internal') naming it, instead of a trap.
 */
export function run(p, req) {
  if (!(req instanceof Request)) throw new TypeError('run(probe, req): req is a Request');
  req.configSpec = p.config;
  let outcome;
  try {
    outcome = p.check(req);
  } catch (e) {
    if (e instanceof ProbeError) throw e;
    throw ProbeError.internal(`${e?.name ?? 'Error'}: ${e?.message ?? String(e)}${location(e)}`);
  }
  if (outcome && typeof outcome.then === 'function') {
    throw ProbeError.internal('check returned a Promise: a sonde check is synchronous (the host calls block)');
  }
  if (!(outcome instanceof Outcome)) throw ProbeError.internal(`check returned ${typeof outcome}, not an Outcome`);
  return outcome;
}
