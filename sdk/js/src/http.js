// HTTP through the host's probe transport (`sonde:probe/http`): a new
// connection per request closed with a reset, each phase timed, or one from
// the host's pool with keepalive. Only the probe's target and its `net`
// grants are reachable (else ProbeError('denied')). Redirects are returned,
// not followed.

import { currentHost } from './host.js';
import { ProbeError } from './core.js';
import { TlsOptions } from './tls.js';

export const MAX_KEPT_HEADERS = 64;

/** A request for send(); `timeout` in seconds. */
export class HttpRequest {
  constructor({ url, method = 'GET', headers = [], body = new Uint8Array(0), timeout = 1, maxBody = 10 * 1024, tls = new TlsOptions(), keepalive = false }) {
    Object.assign(this, { url, method, headers, body, timeout, maxBody, tls, keepalive });
  }
  /** A GET of `url` with no headers and a 10 KiB body cap. */
  static get(url, timeout) {
    return new HttpRequest({ url, timeout });
  }
}

/** What came back: status, headers [[name, value]], body (Uint8Array), timings (seconds), tls, reused. */
export class HttpResponse {
  constructor({ status, headers = [], body = new Uint8Array(0), timings = {}, tls = undefined, reused = false }) {
    this.status = status;
    this.headers = headers;
    this.body = body;
    this.timings = { dns: 0, connect: 0, tls: 0, firstByte: 0, total: 0, ...timings };
    this.tls = tls;
    this.reused = reused;
  }
  /** The first value of header `name` (case-insensitive). */
  header(name) {
    const n = name.toLowerCase();
    return this.headers.find(([k]) => k.toLowerCase() === n)?.[1];
  }
  /** The body as UTF-8 text. */
  text() {
    return new TextDecoder().decode(this.body);
  }
  /** The body parsed as JSON; throws SyntaxError when it is not. */
  json() {
    return JSON.parse(this.text());
  }
}

/**
 * Sends `req` and reads the response within req.timeout. A failing target
 * throws NetError ('dns', 'connect', 'timeout', 'protocol', 'tls'); not
 * granted: ProbeError('denied'); malformed: ProbeError('invalid-config').
 */
export function send(req) {
  return currentHost().httpSend(req instanceof HttpRequest ? req : new HttpRequest(req), undefined);
}

/** As send, but the response carries only the headers named in `keep` (at most 64). */
export function sendKeeping(req, keep) {
  if (keep.length > MAX_KEPT_HEADERS) throw ProbeError.invalidConfig(`at most ${MAX_KEPT_HEADERS} header names to keep, not ${keep.length}`);
  return currentHost().httpSend(req instanceof HttpRequest ? req : new HttpRequest(req), [...keep]);
}

/** send(new HttpRequest({url, timeout, ...fields})). */
export function get(url, timeout = 1, fields = {}) {
  return send(new HttpRequest({ url, timeout, ...fields }));
}
