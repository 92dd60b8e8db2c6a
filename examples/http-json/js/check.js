// http-json: an HTTP JSON health endpoint check, written with @sonde/sdk.
//
// GETs the target (a URL, or host:port plus `path`), requires the JSON field
// `field` (a dotted path; array indices allowed: `checks.0.status`) to equal
// `expected`, reports the response time, and warns when the exchange took
// longer than `warn_after`.
//
//   {"path": "/health", "field": "status", "expected": "ok", "warn_after": "300ms"}
//
// This module imports only '@sonde/sdk', so node's test runner loads it
// (check.test.js); app.js is the component's entry.

import { config, duration, http, log, NetError, Outcome, probe } from '@sonde/sdk';

export const Config = config.define({
  field: config.string({ required: true, description: 'Dotted path of the JSON field to check (`status`, `checks.db.state`, `items.0.ok`).' }),
  expected: config.any({ required: true, description: 'The JSON value the field must equal.' }),
  path: config.string({ default: '/health', description: 'Path appended to a host:port target (a URL target is used as it is).' }),
  warn_after: config.duration({ description: 'A slower exchange is a warning ("300ms").' }),
});

const MISSING = Symbol('missing');

/** The value at `a.b.0.c` in a JSON document, or MISSING. */
export function lookup(doc, dotted) {
  for (const key of dotted.split('.')) {
    if (Array.isArray(doc) && /^\d+$/.test(key) && Number(key) < doc.length) doc = doc[Number(key)];
    else if (doc !== null && typeof doc === 'object' && !Array.isArray(doc) && Object.hasOwn(doc, key)) doc = doc[key];
    else return MISSING;
  }
  return doc;
}

/** JSON equality: true is not 1, 1 is 1.0, objects by their keys. */
export function jsonEqual(a, b) {
  if (Array.isArray(a) || Array.isArray(b)) {
    return Array.isArray(a) && Array.isArray(b) && a.length === b.length && a.every((x, i) => jsonEqual(x, b[i]));
  }
  if (a !== null && b !== null && typeof a === 'object' && typeof b === 'object') {
    const ka = Object.keys(a).sort();
    const kb = Object.keys(b).sort();
    return ka.length === kb.length && ka.every((k, i) => k === kb[i] && jsonEqual(a[k], b[k]));
  }
  return a === b;
}

const show = (v) => {
  const text = JSON.stringify(v);
  return text.length <= 80 ? text : `${text.slice(0, 77)}...`;
};

export const httpJson = probe({
  name: 'http-json',
  version: '0.1.0',
  vendor: 'sonde examples',
  description: 'Checks that a JSON health endpoint reports the expected value, and how fast.',
  config: Config,
  check(req) {
    const c = req.config();
    const url = req.target.includes('://') ? req.target : `http://${req.target}${c.path}`;
    const request = http.HttpRequest.get(url, req.remaining());
    request.headers.push(['accept', 'application/json']);
    let response;
    try {
      response = http.send(request);
    } catch (e) {
      // The target failed (refused, timeout...): a verdict, not an error.
      if (e instanceof NetError) return Outcome.failure(`GET ${url}: ${e.reason}`);
      throw e;
    }
    const seconds = response.timings.total;
    const metrics = [['response_seconds', seconds, 'seconds'], ['status_code', response.status, '']];
    const excerpt = () => response.text().slice(0, 256);
    if (response.status < 200 || response.status >= 300) {
      return Outcome.failure(`GET ${url}: status ${response.status}`, { metrics, detail: excerpt() });
    }
    let doc;
    try {
      doc = response.json();
    } catch {
      return Outcome.failure(`GET ${url}: the body is not JSON`, { metrics, detail: excerpt() });
    }
    const value = lookup(doc, c.field);
    if (value === MISSING) return Outcome.failure(`${c.field}: no such field`, { metrics, detail: excerpt() });
    if (!jsonEqual(value, c.expected)) {
      return Outcome.failure(`${c.field} is ${show(value)}, expected ${show(c.expected)}`, { metrics });
    }
    const took = duration.format(Math.round(seconds * 1000) / 1000);
    if (c.warn_after !== undefined && seconds > c.warn_after) {
      return Outcome.warning(`${c.field} is ${show(value)}, but the answer took ${took} (over ${duration.format(c.warn_after)})`, { metrics });
    }
    log.debug(`${url}: ${c.field} = ${show(value)} in ${took}`);
    return Outcome.success(`${c.field} is ${show(value)} (${took})`, { metrics });
  },
});
