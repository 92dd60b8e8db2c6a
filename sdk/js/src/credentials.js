// Secrets the plugin uses but never sees (`sonde:probe/credentials`).
//
// An operator grants a probe secrets (`grants.secrets`), and the probe's
// config names them by *handle*: `$(secret:NAME)` in a text stands for the
// secret's bytes (and `$(base64:...)` for the base64 of what it encloses).
// The plugin passes such text to the host, which expands it only toward the
// probe's target and its `net` grants and puts the bytes on the wire
// itself; the plugin never holds them, and what a peer answers that
// reflects one reaches it as `[withheld: the peer reflected a secret]`.
//
// - postgresLogin and redisLogin log in on a Session the plugin opened with
//   tcp.connect (or tls.connect);
// - clientCertificate (or ClientCert#present) registers a client
//   certificate (PEM text or handles) that the host presents to a peer in
//   every TLS handshake of the call (tls, http, grpc).
//
// A probe granted secrets reaches peers only through the host's transports
// (it gets no `wasi:sockets`). A password that holds no handle is sent as it
// is written, so the same plugin code serves plain configs too.
//
//   const [session] = tcp.connect(host, port, req.remaining());
//   const login = credentials.redisLogin(session, undefined, c.password, req.remaining());
//   if (!login.accepted) return Outcome.failure(`AUTH refused: ${login.error}`);
//
// The Rust SDK's Login::Accepted(method) / Login::Refused(error) is a Login
// here ({accepted, method} or {accepted: false, error}); its
// LoginError::Failed is LoginError (a NetError: the target failed), its
// LoginError::Probe a plain ProbeError ('denied', 'invalid-config'), as
// everywhere in this SDK.

import { currentHost } from './host.js';
import { ProbeError } from './core.js';
import { NetError } from './net.js';
import * as config from './config.js';

// How a handle starts: `$(secret:NAME)`, or `$(base64:...)` around text and
// secret handles.
const HANDLES = ['$(secret:', '$(base64:'];

/**
 * Whether `text` holds a handle (well formed or not): text the host must
 * expand, which only the host's logins and transports can send.
 */
export function hasHandle(text) {
  return HANDLES.some((h) => String(text).includes(h));
}

/** What a login came to: Login.accepted(method) or Login.refused(error). */
export class Login {
  constructor(accepted, text) {
    this.accepted = accepted;
    if (accepted) {
      /** `trust`, `password`, `md5` or `scram-sha-256` (PostgreSQL), `auth` (Redis). */
      this.method = text;
    } else {
      /** The server's error (PostgreSQL: `SEVERITY CODE: message (detail)`; Redis: the error reply without its `-`), withheld whole when it reflects a secret. */
      this.error = text;
    }
    Object.freeze(this);
  }
  /** The server accepted the login. */
  static accepted(method) {
    return new Login(true, String(method));
  }
  /** The server refused the login. */
  static refused(error) {
    return new Login(false, String(error));
  }
}

/**
 * The server failed during a login: it closed the connection ('connect'),
 * did not answer in time ('timeout'), or broke the protocol ('protocol': a
 * SCRAM signature that does not verify, a malformed message). A NetError,
 * so of kind 'io': catch it to report a failure.
 */
export class LoginError extends NetError {
  constructor(failure, message) {
    super(failure, message);
    this.name = 'LoginError';
  }
}

// What the host answers, as this module gives it; the component's glue
// (component.js) passes each WIT variant as it is ({tag, val}). Not part of
// the plugin-facing surface.

/** The WIT `login` variant: accepted(method) or refused(error). */
export function fromWit(login) {
  if (login?.tag === 'accepted') return Login.accepted(login.val);
  if (login?.tag === 'refused') return Login.refused(login.val);
  throw ProbeError.internal(`login: unknown case ${JSON.stringify(login?.tag)}`);
}

/**
 * A login's `tls-error`: the server's failure (LoginError: 'dns',
 * 'connect', 'timeout', or 'protocol' for the host's `handshake`), or the
 * check's (a secret or peer denied, a malformed handle, a session holding
 * unread data, a login the host does not speak).
 */
export function loginError({ tag, val }) {
  if (tag === 'denied') return ProbeError.denied(val);
  if (tag === 'invalid') return ProbeError.invalidConfig(val);
  return new LoginError(tag === 'handshake' ? 'protocol' : tag, val);
}

/** `client-certificate`'s `tls-error`: denied, invalid-config, or an i/o error naming the peer. */
export function clientCertificateError({ tag, val }, host, port) {
  if (tag === 'denied') return ProbeError.denied(val);
  if (tag === 'invalid') return ProbeError.invalidConfig(val);
  return ProbeError.io(`client certificate for ${host}:${port}: ${val}`);
}

function rawSession(session) {
  const raw = session?.raw;
  if (!raw) throw ProbeError.internal('log in on an open session (from tcp.connect or tls.connect), not a closed one');
  return raw;
}

const ms = (seconds) => Math.max(1, Math.trunc(seconds * 1000));

/**
 * Logs in to the PostgreSQL server at the other end of `session` as
 * `user`, the host answering its authentication requests (cleartext, md5,
 * SCRAM-SHA-256 with the server's signature verified) with `password`, a
 * handle such as '$(secret:pg-password)'. Call it right after sending the
 * StartupMessage naming `user`; when accepted, the messages that follow
 * AuthenticationOk (ParameterStatus, BackendKeyData, ReadyForQuery) are
 * yours to read. Waits at most `timeout` seconds in all.
 *
 * A failing server throws LoginError; a secret not granted toward this
 * peer ProbeError('denied'); a malformed handle, a session holding unread
 * data, or a login the host does not speak (GSSAPI)
 * ProbeError('invalid-config').
 */
export function postgresLogin(session, user, password, timeout = 1) {
  return currentHost().postgresLogin(rawSession(session), String(user), String(password), ms(timeout));
}

/**
 * Logs in to the Redis server at the other end of `session` with `AUTH
 * [username] password` (`password` a handle; `username` undefined for plain
 * `AUTH password`) and reads its reply: `+OK` is Login.accepted('auth'), an
 * error reply Login.refused(error). Call it right after connecting. Waits
 * at most `timeout` seconds. Errors as postgresLogin.
 */
export function redisLogin(session, username, password, timeout = 1) {
  const user = username === undefined || username === null ? undefined : String(username);
  return currentHost().redisLogin(rawSession(session), user, String(password), ms(timeout));
}

/**
 * From now until the call ends, every TLS handshake the host makes for the
 * call with host:port presents this client certificate: `cert` (a PEM
 * chain) and `key` (a PEM private key), each PEM text or a handle such as
 * '$(secret:client-key)'. The peer must be the target or a `net` grant; at
 * most 4 per call, and a second one for a peer replaces the first. A
 * denied peer or secret is ProbeError('denied'), a certificate that does
 * not parse ProbeError('invalid-config').
 */
export function clientCertificate(host, port, cert, key) {
  currentHost().clientCertificate(String(host), Number(port), String(cert), String(key));
}

/**
 * A client certificate as a plugin's config gives it,
 * `"client_cert": {"cert": "$(secret:crt)", "key": "$(secret:key)"}`: each
 * part a handle or PEM text. Its config field is ClientCert.field():
 *
 *   const Config = config.define({ client_cert: ClientCert.field() });
 *   const cert = ClientCert.from(req.config().client_cert);   // undefined when not given
 *   cert?.present(host, port);
 */
export class ClientCert {
  constructor({ cert, key }) {
    this.cert = String(cert);
    this.key = String(key);
  }
  /** The config field: an object of `cert` and `key` (both strings), unknown keys refused. */
  static field(opts = {}) {
    return config.object(
      {
        cert: config.string({ required: true, description: 'The client certificate chain (PEM), or a handle such as "$(secret:crt)".' }),
        key: config.string({ required: true, description: 'Its private key (PEM), or a handle such as "$(secret:key)".' }),
      },
      { description: 'A client certificate (mTLS) the host presents; each part PEM text or a secret handle.', ...opts },
    );
  }
  /** A ClientCert from a parsed config value ({cert, key}); undefined stays undefined. */
  static from(value) {
    return value === undefined || value === null ? undefined : new ClientCert(value);
  }
  /** Has the host present it to host:port (clientCertificate). */
  present(host, port) {
    clientCertificate(host, port, this.cert, this.key);
  }
  // PEM text may be a private key: only handles are shown.
  toJSON() {
    const shown = (v) => (hasHandle(v) ? v : `<${v.length} chars of PEM>`);
    return { cert: shown(this.cert), key: shown(this.key) };
  }
  toString() {
    return `ClientCert(${JSON.stringify(this.toJSON())})`;
  }
  [Symbol.for('nodejs.util.inspect.custom')]() {
    return this.toString();
  }
}
