// TLS by the host (`sonde:probe/tls`), and the TLS options `http` takes.
// The host runs the TLS client; no TLS code runs in the sandbox. Only the
// probe's target and its `net` grants are reachable.

import { currentHost, unixSeconds } from './host.js';
import { ProbeError } from './core.js';
import { readUntil as readUntilWith } from './net.js';

/** How the host verifies a server (all optional). */
export class TlsOptions {
  constructor({ caPem = undefined, insecureSkipVerify = false, serverName = undefined } = {}) {
    this.caPem = caPem;
    this.insecureSkipVerify = insecureSkipVerify;
    this.serverName = serverName;
  }
  /**
   * From the usual config keys (ca_pem, insecure_skip_verify, server_name).
   * `ca_file` is refused: a JavaScript component has no filesystem access
   * in this SDK (pass the PEM text as ca_pem).
   */
  static fromConfig({ ca_file, ca_pem, insecure_skip_verify = false, server_name } = {}) {
    if (ca_file !== undefined) {
      throw ProbeError.invalidConfig('ca_file is not supported by JavaScript plugins: give the PEM text as ca_pem');
    }
    if (ca_pem !== undefined && insecure_skip_verify) {
      throw ProbeError.invalidConfig('a CA and insecure_skip_verify exclude each other: a CA is not checked when verification is off');
    }
    return new TlsOptions({ caPem: ca_pem, insecureSkipVerify: insecure_skip_verify, serverName: server_name });
  }
}

/** What a TLS handshake established (notBefore/notAfter in Unix seconds). */
export class TlsInfo {
  constructor({ version, alpn, notBefore, notAfter, subject, issuer }) {
    Object.assign(this, { version, alpn, notBefore: Number(notBefore), notAfter: Number(notAfter), subject, issuer });
  }
  /** Seconds until the server certificate expires (negative once it has). */
  expiresInSeconds() {
    return this.notAfter - unixSeconds();
  }
}

/**
 * A connection the host holds for the plugin (TLS, or TCP from tcp.connect).
 * close() resets it; a call may hold at most 4 at once.
 */
export class Session {
  constructor(raw, readTimeout) {
    this.raw = raw;
    this.readTimeout = readTimeout;
  }
  /** Sends all of `data` (a Uint8Array or a string); throws SessionError. */
  send(data) {
    this.raw.send(typeof data === 'string' ? new TextEncoder().encode(data) : data);
  }
  /** Waits at most readTimeout seconds; returns what arrived (at most 64 KiB), empty when the peer closed. */
  read(maxBytes = 65536) {
    return this.raw.receive(Math.min(maxBytes, 65536), Math.trunc(this.readTimeout * 1000));
  }
  /** Reads until done(bytes), the peer closes, maxBytes or an error: {data, error}. */
  readUntil(maxBytes, done) {
    return readUntilWith((n) => this.read(n), maxBytes, done);
  }
  /**
   * Upgrades this plain session (from tcp.connect) to TLS in place, after the
   * exchange that asked for it (SMTP's or IMAP's STARTTLS, PostgreSQL's
   * SSLRequest): the host completes a handshake over the same connection
   * within `timeout` seconds (the read timeout when undefined), verified as
   * connect() verifies (the name is the host the session was opened to
   * unless options.serverName); what is sent and read afterwards goes over
   * TLS. Returns {info, dnsSeconds, connectSeconds, tlsSeconds}. A session
   * that is TLS already throws ProbeError (invalid config); a failed
   * handshake, unread data the peer sent before the upgrade, or a closed
   * peer throw NetError; a failed handshake leaves the session closed.
   */
  starttls(options = new TlsOptions(), timeout = undefined) {
    const wait = timeout ?? this.readTimeout;
    return this.raw.starttls(options, Math.max(1, Math.trunc(wait * 1000)));
  }
  close() {
    const raw = this.raw;
    this.raw = null;
    raw?.close?.();
  }
  [Symbol.dispose]() {
    this.close();
  }
}

/**
 * Connects to host:port, completes a TLS handshake within `timeout` seconds
 * and closes. Returns {info, dnsSeconds, connectSeconds, tlsSeconds}; a
 * failing server throws NetError, a denial or bad options ProbeError.
 */
export function handshake(host, port, options = new TlsOptions(), timeout = 1) {
  return currentHost().tlsHandshake(host, port, options, Math.trunc(timeout * 1000));
}

/** As handshake, but keeps the connection open: [Session, handshake]. */
export function connect(host, port, options = new TlsOptions(), timeout = 1) {
  const [raw, hs] = currentHost().tlsConnect(host, port, options, Math.trunc(timeout * 1000));
  return [new Session(raw, timeout), hs];
}
