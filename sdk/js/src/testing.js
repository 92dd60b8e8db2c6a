// Testing a check two ways.
//
// 1. Unit tests under node (`run` with a `FakeHost`): the check's own code
//    runs in node, and every host capability it calls (http.send,
//    tcp.connect, tls.*, grpc.call, exec.run, log.*, credentials.*, the
//    clocks) is answered
//    by the fake host you program. THIS IS A UNIT-TEST DOUBLE, NOT SONDE: no
//    sandbox, no WIT boundary, no deadline, fuel or memory cap, no real
//    network, and node is not StarlingMonkey (the engine in the component);
//    the fake's grant check only mimics the host's (the target and
//    `allowNet` host:port pairs). It tests your logic: config handling,
//    verdicts, messages, metrics.
//
//      const host = new FakeHost({ http: { 'http://127.0.0.1:8080/health': respond(200, { status: 'ok' }, { seconds: 0.05 }) } });
//      const outcome = run(httpJson, { target: '127.0.0.1:8080', config: { field: 'status', expected: 'ok' }, host });
//
// 2. The real thing (`Plugin`): builds the component with componentize-js
//    and runs it with the `sonde` binary (`sonde check FILE.wasm --output
//    json`), in its sandbox, against a real target. Slower (a build takes
//    tens of seconds, the first run compiles the component); what CI runs.
//
//      const plugin = await Plugin.build('examples/http-json/js/app.js');
//      const result = plugin.check('127.0.0.1:8080').config({ field: 'status', expected: 'ok' }).run();

import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { installHost } from './host.js';
import { ProbeError, Request } from './core.js';
import { NetError, SessionError } from './net.js';
import { HttpResponse } from './http.js';
import { TlsInfo } from './tls.js';
import { run as runProbe } from './probe.js';
import { Login, LoginError } from './credentials.js';

export { NetError, SessionError, Login, LoginError };

const encoder = new TextEncoder();

/**
 * A fake response; an object or array body is sent as JSON, `seconds` is the
 * exchange's total time (the other phases are split from it).
 */
export function respond(status = 200, body = '', { headers = [], seconds = 0.001, tls = undefined } = {}) {
  const hdrs = headers.map(([n, v]) => [n.toLowerCase(), v]);
  let bytes;
  if (body instanceof Uint8Array) bytes = body;
  else if (typeof body === 'string') bytes = encoder.encode(body);
  else if (body === null || body === undefined) bytes = new Uint8Array(0);
  else {
    bytes = encoder.encode(JSON.stringify(body));
    if (!hdrs.some(([n]) => n === 'content-type')) hdrs.push(['content-type', 'application/json']);
  }
  return new HttpResponse({
    status,
    headers: hdrs,
    body: bytes,
    timings: { dns: 0, connect: seconds / 4, tls: 0, firstByte: (seconds * 3) / 4, total: seconds },
    tls,
  });
}

/** A fake certificate that expires in `daysLeft` days. */
export function tlsInfo({ daysLeft = 90, subject = 'CN=example', issuer = 'CN=Test CA', version = 'TLSv1.3' } = {}) {
  const now = Math.floor(Date.now() / 1000);
  return new TlsInfo({ version, alpn: undefined, notBefore: now - 86400, notAfter: now + Math.floor(daysLeft * 86400), subject, issuer });
}

/**
 * A scripted connection: receive() returns `replies` one by one, then an
 * empty array (the peer closed), or times out when `hang` is set. What the
 * check sent is in `sent`.
 */
export class FakeSession {
  constructor(replies = [], { hang = false, tls = undefined } = {}) {
    this.replies = replies.map((r) => (typeof r === 'string' ? encoder.encode(r) : r));
    this.hang = hang;
    /** What starttls() gives: the certificate (a tlsInfo() when undefined), or the error it throws. */
    this.tls = tls;
    /** The options of the starttls() the check made, if it made one. */
    this.upgraded = undefined;
    this.sent = [];
    this.closed = false;
    /** [host, port] it was connected to (set by the FakeHost). */
    this.peer = undefined;
  }
  send(data) {
    if (this.closed) throw new SessionError('other', 'connection closed');
    this.sent.push(data);
  }
  receive(max, timeoutMs) {
    if (this.replies.length) {
      const head = this.replies[0];
      if (head.length > max) {
        this.replies[0] = head.subarray(max);
        return head.subarray(0, max);
      }
      this.replies.shift();
      return head;
    }
    if (this.hang) throw new SessionError('timed-out', `no data within ${timeoutMs}ms`);
    return new Uint8Array(0);
  }
  starttls(options) {
    if (this.upgraded) throw ProbeError.invalidConfig('starttls: the session is TLS already');
    if (this.tls instanceof Error) {
      this.closed = true;
      throw this.tls;
    }
    this.upgraded = options;
    return { info: this.tls ?? tlsInfo(), dnsSeconds: 0, connectSeconds: 0, tlsSeconds: 0.001 };
  }
  close() {
    this.closed = true;
  }
}

function answer(handler, keys, ...args) {
  const refused = () => new NetError('connect', `connection refused (no fake answer for ${keys[0]})`);
  if (!handler) throw refused();
  let value;
  if (typeof handler === 'function') value = handler(...args);
  else {
    const key = keys.find((k) => Object.hasOwn(handler, k));
    if (key === undefined) throw refused();
    value = handler[key];
  }
  if (value instanceof Error) throw value;
  return value;
}

const SECRET = '$(secret:';
const BASE64 = '$(base64:';
const validSecretName = (n) => /^[a-z0-9][a-z0-9._-]{0,62}$/.test(n);
const short = (t) => JSON.stringify(t.slice(0, 40));

/**
 * The names of the secrets `text`'s handles use, as the host parses them:
 * `$(secret:NAME)`, and `$(base64:...)` around text and such handles. A
 * malformed handle is ProbeError('invalid-config'), as the host refuses it
 * (a typo is never sent as text).
 */
export function secretNames(text) {
  const names = [];
  let inside = false;
  for (;;) {
    const starts = [text.indexOf(SECRET), text.indexOf(BASE64)].filter((i) => i >= 0);
    const handle = starts.length ? Math.min(...starts) : -1;
    const close = inside ? text.indexOf(')') : -1;
    if (close >= 0 && (handle < 0 || close < handle)) {
      text = text.slice(close + 1);
      inside = false;
      continue;
    }
    if (handle < 0) {
      if (inside) throw ProbeError.invalidConfig(`${short(text)} has no closing \`)\``);
      return names;
    }
    const rest = text.slice(handle);
    if (rest.startsWith(SECRET)) {
      const end = rest.indexOf(')', SECRET.length);
      if (end < 0) throw ProbeError.invalidConfig(`${short(rest)} has no closing \`)\``);
      const name = rest.slice(SECRET.length, end);
      if (!validSecretName(name)) {
        throw ProbeError.invalidConfig(
          `secret handle ${JSON.stringify(rest.slice(0, end + 1))}: ${JSON.stringify(name)} is not a secret name (1 to 63 of a-z, 0-9, \`-\`, \`_\`, \`.\`)`,
        );
      }
      names.push(name);
      text = rest.slice(end + 1);
    } else {
      if (inside) throw ProbeError.invalidConfig('`$(base64:` cannot enclose another `$(base64:`');
      text = rest.slice(BASE64.length);
      inside = true;
    }
  }
}

function authority(address) {
  if (address.includes('://')) {
    const u = new URL(address);
    return `${u.hostname.replace(/^\[|\]$/g, '')}:${u.port || (u.protocol === 'https:' ? 443 : 80)}`;
  }
  const at = address.lastIndexOf(':');
  return `${address.slice(0, at).replace(/^\[|\]$/g, '')}:${address.slice(at + 1)}`;
}

// Marks whom a fake session is connected to (a login goes toward it).
function peer(session, host, port) {
  if (session && typeof session === 'object' && !Object.isFrozen(session)) session.peer = [host, port];
  return session;
}

function splitAuthority(a) {
  const at = a.lastIndexOf(':');
  return [a.slice(0, at), Number(a.slice(at + 1))];
}

/**
 * A fake sonde host for unit tests (a test double, not sonde).
 *
 * Each capability takes a handler: a function given what the check asked
 * for, or an object keyed by it. Either gives the answer, or an Error to
 * throw (new NetError('connect', 'connection refused'),
 * ProbeError.denied(...)). A capability with no handler answers like a
 * closed port.
 *
 * - http: fn(HttpRequest) or {'URL' or 'METHOD URL': HttpResponse}
 * - tcp: fn(host, port) or {'host:port': FakeSession}
 * - tls: fn(host, port, options) or {'host:port': TlsInfo or [FakeSession, TlsInfo]}
 * - grpc: fn(GrpcRequest) or {'/pkg.Service/Method': {code, statusMessage, message, metadata, timings}}
 * - exec: fn(argv) or {'/abs/program': {exitCode, timedOut, stdout, stderr}}
 * - logins (credentials.postgresLogin, redisLogin): fn(attempt) or
 *   {'redis host:port' / 'postgres host:port' / 'host:port': Login}, a Login
 *   being Login.accepted('auth') or Login.refused('WRONGPASS ...'), or a
 *   new LoginError('timeout', ...) to throw. An attempt is {kind ('postgres'
 *   or 'redis'), host, port, user, password (as the check passed it: a
 *   handle, which the fake only checks is granted), session, timeout}.
 *
 * `allowNet` lists the host:port pairs granted besides the target; anything
 * else is refused as the host refuses it (ProbeError 'denied'). `secrets`
 * lists the secret names granted (as `sonde check --secret NAME=FILE`
 * does): a handle naming another is denied, a malformed one
 * invalid-config, as the host answers. `now` (Unix seconds) fixes the wall
 * clock. Records: logs [level, message], httpRequests, grpcRequests,
 * execCalls, loginAttempts, clientCerts ({'host:port': {cert, key}} as
 * registered: handles or PEM text, as the check passed them).
 */
export class FakeHost {
  constructor({ http, tcp, tls, grpc, exec, logins, allowNet = [], secrets = [], now } = {}) {
    Object.assign(this, { http, tcp, tls, grpc, exec, logins, allowNet, secrets, now });
    this.target = undefined;
    this.logs = [];
    this.httpRequests = [];
    this.grpcRequests = [];
    this.execCalls = [];
    this.loginAttempts = [];
    this.clientCerts = {};
  }
  // The secret check, as the host makes it before it expands a handle.
  secretsToward(text, host, port) {
    for (const name of secretNames(text)) {
      if (!this.secrets.includes(name)) {
        throw ProbeError.denied(
          this.secrets.length
            ? `secret "${name}" is not in the probe's grants.secrets (${this.secrets.join(', ')})`
            : `secret "${name}" is not granted: the probe's grants.secrets is empty`,
        );
      }
      this.granted(`${host}:${port}`);
    }
  }
  granted(address) {
    if (!this.target) return;
    const allowed = [this.target, ...this.allowNet].map(authority);
    if (!allowed.includes(authority(address))) throw ProbeError.denied(`${authority(address)}: not the target and not granted`);
  }
  log(level, message) {
    this.logs.push([level, message]);
  }
  monotonic() {
    return performance.now() / 1000;
  }
  unixSeconds() {
    return this.now ?? Date.now() / 1000;
  }
  httpSend(req, keep) {
    if (!/^https?:\/\//.test(req.url)) throw ProbeError.invalidConfig(`url ${JSON.stringify(req.url)}: not an absolute http:// or https:// URL`);
    this.granted(req.url);
    this.httpRequests.push(req);
    let r = answer(this.http, [`${req.method} ${req.url}`, req.url], req);
    let headers = r.headers;
    if (keep) headers = headers.filter(([n]) => keep.map((k) => k.toLowerCase()).includes(n.toLowerCase()));
    return new HttpResponse({ ...r, headers, body: r.body.subarray(0, req.maxBody) });
  }
  fakeTls(host, port, options) {
    this.granted(`${host}:${port}`);
    const a = answer(this.tls, [`${host}:${port}`], host, port, options);
    return Array.isArray(a) ? a : [undefined, a];
  }
  tlsHandshake(host, port, options) {
    const [, info] = this.fakeTls(host, port, options);
    return { info, dnsSeconds: 0, connectSeconds: 0.001, tlsSeconds: 0.002 };
  }
  tlsConnect(host, port, options) {
    const [session, info] = this.fakeTls(host, port, options);
    return [peer(session ?? new FakeSession(), host, port), { info, dnsSeconds: 0, connectSeconds: 0.001, tlsSeconds: 0.002 }];
  }
  tcpConnect(host, port) {
    this.granted(`${host}:${port}`);
    return [peer(answer(this.tcp, [`${host}:${port}`], host, port), host, port), { dnsSeconds: 0, connectSeconds: 0.001 }];
  }
  login(kind, session, user, password, timeoutMs) {
    const [host, port] = session.peer ?? (this.target ? splitAuthority(authority(this.target)) : ['', 0]);
    this.secretsToward(password, host, port);
    const attempt = { kind, host, port, user, password, session, timeout: timeoutMs / 1000 };
    this.loginAttempts.push(attempt);
    const closed = () => new LoginError('connect', `the server closed the connection during the login (no fake answer for ${host}:${port})`);
    let value;
    if (!this.logins) throw closed();
    if (typeof this.logins === 'function') value = this.logins(attempt);
    else {
      const key = [`${kind} ${host}:${port}`, `${host}:${port}`].find((k) => Object.hasOwn(this.logins, k));
      if (key === undefined) throw closed();
      value = this.logins[key];
    }
    if (value instanceof Error) throw value;
    if (!(value instanceof Login)) throw new TypeError(`a fake login answers Login.accepted(...), Login.refused(...) or an Error, not ${JSON.stringify(value)}`);
    return value;
  }
  postgresLogin(session, user, password, timeoutMs) {
    return this.login('postgres', session, user, password, timeoutMs);
  }
  redisLogin(session, username, password, timeoutMs) {
    return this.login('redis', session, username, password, timeoutMs);
  }
  clientCertificate(host, port, cert, key) {
    if (!host) throw ProbeError.invalidConfig('no host');
    this.granted(`${host}:${port}`);
    this.secretsToward(cert, host, port);
    this.secretsToward(key, host, port);
    for (const [what, text] of [['certificate', cert], ['private key', key]]) {
      if (!secretNames(text).length && !text.includes('-----BEGIN')) {
        throw ProbeError.invalidConfig(`client certificate for ${host}:${port}: the ${what} is neither PEM nor a handle`);
      }
    }
    const id = `${host}:${port}`;
    if (!Object.hasOwn(this.clientCerts, id) && Object.keys(this.clientCerts).length >= 4) {
      throw ProbeError.invalidConfig('at most 4 client certificates per call');
    }
    this.clientCerts[id] = { cert, key };
  }
  grpcCall(req) {
    this.granted(req.authority);
    this.grpcRequests.push(req);
    return answer(this.grpc, [req.method], req);
  }
  execRun(argv) {
    this.execCalls.push(argv);
    if (!this.exec) throw ProbeError.denied(`${argv[0] ?? '?'}: not granted`);
    return answer(this.exec, [argv[0]], argv);
  }
}

/**
 * Runs probe `p`'s check once in node against `host` (a FakeHost; a fresh
 * one when omitted) and returns its Outcome. A ProbeError is thrown as the
 * check threw it; a bug (any other exception) as ProbeError('internal'), as
 * the component reports it.
 */
export function run(p, { target = '', config = '{}', host = new FakeHost(), timeout = 1, attempt = 1 } = {}) {
  host.target = target || undefined;
  const previous = installHost(host);
  try {
    return runProbe(p, new Request(target, config, timeout, { attempt }));
  } finally {
    installHost(previous);
  }
}

// --- the real thing: componentize-js + the sonde binary --------------------

/** $SONDE_BIN, else `sonde` on PATH. */
export function sondeBin() {
  return process.env.SONDE_BIN || 'sonde';
}

/** A component and the `sonde` binary that runs it. */
export class Plugin {
  constructor(wasm, { buildSeconds = 0 } = {}) {
    this.wasm = wasm;
    this.buildSeconds = buildSeconds;
    // sonde's compile budget scales with the component's size; set this
    // (e.g. '300s') to give the first compile a fixed, longer one.
    this.compileTimeout = undefined;
    this.cacheDir = process.env.SONDE_TEST_CACHE_DIR;
  }
  /** Builds `entry` with componentize-js (a fresh build each time: never a stale component). */
  static async build(entry, out = join(mkdtempSync(join(tmpdir(), 'sonde-js-')), 'plugin.wasm')) {
    const { componentize } = await import('./build.js');
    const { seconds } = await componentize(entry, out);
    return new Plugin(out, { buildSeconds: seconds });
  }
  static fromFile(wasm) {
    return new Plugin(wasm);
  }
  check(target) {
    return new Check(this, target);
  }
}

/** One `sonde check` to run: target, config, grants, timeout. */
export class Check {
  constructor(plugin, target) {
    this.plugin = plugin;
    this.args = ['--target', target];
  }
  config(config) {
    this.args.push('--config', typeof config === 'string' ? config : JSON.stringify(config));
    return this;
  }
  timeout(seconds) {
    this.args.push('--timeout', `${Math.max(1, Math.trunc(seconds * 1000))}ms`);
    return this;
  }
  allowNet(pattern) {
    this.args.push('--allow-net', pattern);
    return this;
  }
  allowExec(program) {
    this.args.push('--allow-exec', program);
    return this;
  }
  /**
   * Grants the secret `name`, read from `file` (which sonde refuses if
   * every user may read it: chmod 600); the config names it '$(secret:NAME)'.
   */
  secret(name, file) {
    this.args.push('--secret', `${name}=${file}`);
    return this;
  }
  argv() {
    const p = this.plugin;
    const budget = p.compileTimeout ? ['--compile-timeout', p.compileTimeout, '--compile-timeout-max', p.compileTimeout] : [];
    return [...budget, ...(p.cacheDir ? ['--cache-dir', p.cacheDir] : []), 'check', p.wasm, ...this.args, '--output', 'json'];
  }
  /**
   * Runs `sonde check --output json` and waits for it (blocking this
   * process: a target served by this same process needs runAsync):
   * {status, reason, message, metrics, detail, exitCode, seconds, stderr, metric(name)}.
   */
  run() {
    const start = performance.now();
    const out = spawnSync(sondeBin(), this.argv(), { encoding: 'utf8' });
    if (out.error) throw new Error(`cannot run ${sondeBin()} (${out.error.message}); set SONDE_BIN to the sonde binary`);
    return result(out.stdout, out.stderr, out.status, (performance.now() - start) / 1000);
  }
  /** As run(), without blocking the event loop. */
  runAsync() {
    const start = performance.now();
    return new Promise((resolve, reject) => {
      const child = spawn(sondeBin(), this.argv());
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (d) => (stdout += d));
      child.stderr.on('data', (d) => (stderr += d));
      child.on('error', (e) => reject(new Error(`cannot run ${sondeBin()} (${e.message}); set SONDE_BIN to the sonde binary`)));
      child.on('close', (code) => {
        try {
          resolve(result(stdout, stderr, code, (performance.now() - start) / 1000));
        } catch (e) {
          reject(e);
        }
      });
    });
  }
}

function result(stdout, stderr, exitCode, seconds) {
  let v;
  try {
    v = JSON.parse(stdout);
  } catch {
    throw new Error(`sonde printed no result (exit ${exitCode}): ${stderr.trim()}`);
  }
  const metrics = (v.metrics ?? []).map((m) => [m.name, Number(m.value), m.unit ?? '']);
  return {
    status: v.status ?? 'unknown',
    reason: v.reason ?? undefined,
    message: v.message ?? '',
    metrics,
    detail: v.detail ?? undefined,
    exitCode,
    seconds,
    stderr,
    metric: (name) => metrics.find(([n]) => n === name)?.[1],
  };
}
