// credentials: handles, the mapping of the host's answers, and logins and
// client certificates against the fake host (a unit-test double, not
// sonde; the real host is tested by smoke/credentials.sh).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { inspect } from 'node:util';

import { Outcome, NetError, ProbeError, probe, config, credentials, net, tcp, tls } from '../src/index.js';
import { FakeHost, FakeSession, Plugin, run, secretNames, tlsInfo } from '../src/testing.js';

const { ClientCert, Login, LoginError } = credentials;
const decoder = new TextDecoder();
const encoder = new TextEncoder();

// What a plugin author writes: log in with the handle, then PING.
const redisPing = probe({
  name: 'redis-ping',
  config: config.define({ password: config.string({ required: true }), username: config.string() }),
  check(req) {
    const c = req.config();
    const [host, port] = net.hostPort(req.target);
    const [session] = tcp.connect(host, port, req.remaining());
    try {
      let login;
      try {
        login = credentials.redisLogin(session, c.username, c.password, req.remaining());
      } catch (e) {
        if (e instanceof LoginError) return Outcome.failure(`AUTH: ${e.detail}`);
        throw e;
      }
      if (!login.accepted) return Outcome.failure(`AUTH refused: ${login.error}`);
      session.send('PING\r\n');
      const { data } = session.readUntil(64, (b) => decoder.decode(b).includes('\r\n'));
      return Outcome.success(`${decoder.decode(data).trim()} (${login.method})`);
    } finally {
      session.close();
    }
  },
});

function startupMessage(user) {
  const params = encoder.encode(`user\0${user}\0database\0postgres\0\0`);
  const msg = new Uint8Array(8 + params.length);
  const view = new DataView(msg.buffer);
  view.setInt32(0, msg.length);
  view.setInt32(4, 196608);
  msg.set(params, 8);
  return msg;
}

const pgLogin = probe({
  name: 'pg-login',
  config: config.define({ user: config.string({ required: true }), password: config.string({ required: true }) }),
  check(req) {
    const c = req.config();
    const [host, port] = net.hostPort(req.target);
    const [session] = tcp.connect(host, port, req.remaining());
    session.send(startupMessage(c.user));
    const login = credentials.postgresLogin(session, c.user, c.password, req.remaining());
    if (!login.accepted) return Outcome.failure(login.error);
    const { data } = session.readUntil(4096, (b) => b.includes(0x5a));
    session.close();
    return Outcome.success(`${login.method}, ready: ${data.includes(0x5a)}`);
  },
});

const mtls = probe({
  name: 'mtls',
  config: config.define({ client_cert: ClientCert.field() }),
  check(req) {
    const [host, port] = net.hostPort(req.target);
    ClientCert.from(req.config().client_cert)?.present(host, port);
    return Outcome.success(tls.handshake(host, port, undefined, req.remaining()).info.subject);
  },
});

test('handles are told from plain text', () => {
  assert.ok(credentials.hasHandle('$(secret:pg)'));
  assert.ok(credentials.hasHandle('Basic $(base64:alice:$(secret:pw))'));
  assert.ok(credentials.hasHandle('$(secret:'), "malformed, still the host's to refuse");
  assert.ok(!credentials.hasHandle('s3cret $(HOME) $secret:x'));
});

test('the fake host parses handles as the host does', () => {
  assert.deepEqual(secretNames('plain'), []);
  assert.deepEqual(secretNames('$(secret:a) and $(base64:u:$(secret:b.c-1)) $(HOME)'), ['a', 'b.c-1']);
  for (const [bad, why] of [['$(secret:pw', /no closing/], ['$(secret:Pw)', /not a secret name/], ['$(base64:x', /no closing/], ['$(base64:$(base64:x))', /cannot enclose/]]) {
    assert.throws(() => secretNames(bad), (e) => e.kind === 'invalid-config' && why.test(e.reason), bad);
  }
});

test('a client cert from config never shows PEM, and its field refuses unknown keys', () => {
  const c = new ClientCert({ cert: '$(secret:crt)', key: '-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n' });
  for (const shown of [inspect(c), String(c), JSON.stringify(c)]) {
    assert.ok(!shown.includes('MIIB'), shown);
    assert.ok(shown.includes('$(secret:crt)'), shown);
  }
  const spec = config.define({ client_cert: ClientCert.field() });
  assert.throws(() => spec.parse({ client_cert: { cert: 'a', key: 'b', pem: 'c' } }), /unknown field `client_cert.pem`/);
  assert.throws(() => spec.parse({ client_cert: { cert: 'a' } }), /missing field `client_cert.key`/);
  assert.equal(ClientCert.from(spec.parse({}).client_cert), undefined);
  assert.match(spec.schema('x'), /"required":\["cert","key"\]/);
});

test('a login is accepted with its method or refused with the server error', () => {
  const ok = credentials.fromWit({ tag: 'accepted', val: 'scram-sha-256' });
  assert.deepEqual([ok.accepted, ok.method, ok.error], [true, 'scram-sha-256', undefined]);
  const no = credentials.fromWit({ tag: 'refused', val: 'WRONGPASS invalid username-password pair' });
  assert.deepEqual([no.accepted, no.method, no.error], [false, undefined, 'WRONGPASS invalid username-password pair']);
  assert.ok(no instanceof Login && Object.isFrozen(no));
  assert.throws(() => credentials.fromWit({ tag: 'maybe', val: '' }), (e) => e.kind === 'internal');
});

test("host errors are the target's failure or the check's", () => {
  const denied = credentials.loginError({ tag: 'denied', val: 'secret "x" is not granted' });
  assert.ok(denied instanceof ProbeError && !(denied instanceof NetError));
  assert.deepEqual([denied.kind, denied.reason], ['denied', 'secret "x" is not granted']);
  assert.equal(credentials.loginError({ tag: 'invalid', val: 'GSSAPI' }).kind, 'invalid-config');
  const protocol = credentials.loginError({ tag: 'handshake', val: 'protocol error: x' });
  assert.ok(protocol instanceof LoginError && protocol instanceof NetError);
  assert.deepEqual([protocol.kind, protocol.failure, protocol.detail], ['io', 'protocol', 'protocol error: x']);
  for (const tag of ['dns', 'connect', 'timeout']) {
    const e = credentials.loginError({ tag, val: 'm' });
    assert.deepEqual([e.name, e.failure, e.message], ['LoginError', tag, `i/o error: ${tag}: m`]);
  }
  const where = credentials.clientCertificateError({ tag: 'denied', val: '10.0.0.1:443 is not the target and not granted' }, '10.0.0.1', 443);
  assert.equal(where.kind, 'denied');
  assert.equal(credentials.clientCertificateError({ tag: 'invalid', val: 'bad PEM' }, 'h', 1).kind, 'invalid-config');
  assert.equal(credentials.clientCertificateError({ tag: 'connect', val: 'x' }, 'h', 1).reason, 'client certificate for h:1: x');
});

test('without a host, or on a closed session, a login is refused', () => {
  assert.throws(() => credentials.clientCertificate('h', 1, 'a', 'b'), /no sonde host/);
  const closed = new tls.Session(new FakeSession(), 1);
  closed.close();
  assert.throws(() => credentials.redisLogin(closed, undefined, '$(secret:pw)'), /open session/);
});

const target = '127.0.0.1:6379';
function redisHost(logins, opts = {}) {
  const session = new FakeSession(['+PONG\r\n']);
  return [new FakeHost({ tcp: { [target]: session }, logins, secrets: ['pw'], ...opts }), session];
}

test('redis login accepted, then PING', () => {
  const [host, session] = redisHost({ 'redis 127.0.0.1:6379': Login.accepted('auth') });
  const o = run(redisPing, { target, config: { password: '$(secret:pw)', username: 'probe' }, host });
  assert.equal(o.message, '+PONG (auth)');
  assert.deepEqual(session.sent.map((d) => decoder.decode(d)), ['PING\r\n'], "AUTH is the host's: the plugin sends no password");
  const [a] = host.loginAttempts;
  assert.deepEqual([a.kind, a.host, a.port, a.user, a.password], ['redis', '127.0.0.1', 6379, 'probe', '$(secret:pw)']);
  assert.equal(a.session, session);
  assert.ok(session.closed);
  const [anonymous] = redisHost(() => Login.accepted('auth'));
  run(redisPing, { target, config: { password: '$(secret:pw)' }, host: anonymous });
  assert.equal(anonymous.loginAttempts[0].user, undefined);
});

test('a refused or failed redis login is a failure', () => {
  let [host] = redisHost(() => Login.refused('WRONGPASS invalid username-password pair or user is disabled.'));
  let o = run(redisPing, { target, config: { password: '$(secret:pw)' }, host });
  assert.deepEqual([o.status, o.message], ['failure', 'AUTH refused: WRONGPASS invalid username-password pair or user is disabled.']);
  [host] = redisHost({ [target]: new LoginError('timeout', 'no Redis login within 900ms') });
  assert.equal(run(redisPing, { target, config: { password: '$(secret:pw)' }, host }).message, 'AUTH: no Redis login within 900ms');
  [host] = redisHost(undefined);
  assert.match(run(redisPing, { target, config: { password: '$(secret:pw)' }, host }).message, /closed the connection/);
});

test("a secret not granted or a malformed handle is the check's error", () => {
  let [host] = redisHost(() => Login.accepted('auth'), { secrets: [] });
  assert.throws(() => run(redisPing, { target, config: { password: '$(secret:pw)' }, host }), (e) => e.kind === 'denied' && /grants.secrets is empty/.test(e.reason));
  [host] = redisHost(() => Login.accepted('auth'), { secrets: ['other'] });
  assert.throws(() => run(redisPing, { target, config: { password: '$(secret:pw)' }, host }), /not in the probe's grants.secrets \(other\)/);
  [host] = redisHost(() => Login.accepted('auth'));
  assert.throws(() => run(redisPing, { target, config: { password: '$(secret:pw' }, host }), (e) => e.kind === 'invalid-config');
  // No handle: the text is the password, as the host sends it.
  [host] = redisHost((a) => (a.password === 'plain-pw' ? Login.accepted('auth') : Login.refused('WRONGPASS')), { secrets: [] });
  assert.equal(run(redisPing, { target, config: { password: 'plain-pw' }, host }).status, 'success');
});

test('postgres login after the StartupMessage leaves the rest to read', () => {
  const ready = Uint8Array.from([...encoder.encode('S\0\0\0\x19server_version\x0016.4\0'), 0x5a, 0, 0, 0, 5, 0x49]);
  const session = new FakeSession([ready]);
  const host = new FakeHost({
    tcp: { '127.0.0.1:5432': session },
    secrets: ['db'],
    logins: (a) => (a.kind === 'postgres' && a.user === 'monitor' ? Login.accepted('scram-sha-256') : Login.refused('x')),
  });
  const o = run(pgLogin, { target: '127.0.0.1:5432', config: { user: 'monitor', password: '$(secret:db)' }, host });
  assert.equal(o.message, 'scram-sha-256, ready: true');
  assert.ok(decoder.decode(session.sent[0]).includes('user\0monitor\0'));
  assert.equal(host.loginAttempts[0].kind, 'postgres');
  const refused = new FakeHost({
    tcp: { '127.0.0.1:5432': new FakeSession() },
    secrets: ['db'],
    logins: { 'postgres 127.0.0.1:5432': Login.refused('FATAL 28P01: password authentication failed for user "monitor"') },
  });
  const r = run(pgLogin, { target: '127.0.0.1:5432', config: { user: 'monitor', password: '$(secret:db)' }, host: refused });
  assert.equal(r.status, 'failure');
  assert.match(r.message, /28P01/);
});

test('client certificates are registered toward granted peers', () => {
  const cfg = { client_cert: { cert: '$(secret:crt)', key: '$(secret:key)' } };
  const answer = () => tlsInfo({ subject: 'CN=mtls' });
  const host = new FakeHost({ tls: answer, secrets: ['crt', 'key'] });
  assert.equal(run(mtls, { target: 'example:443', config: cfg, host }).message, 'CN=mtls');
  assert.deepEqual(host.clientCerts, { 'example:443': { cert: '$(secret:crt)', key: '$(secret:key)' } });
  assert.throws(() => run(mtls, { target: 'example:443', config: cfg, host: new FakeHost({ tls: answer, secrets: ['crt'] }) }), /secret "key" is not in/);
  const pem = { client_cert: { cert: '-----BEGIN CERTIFICATE-----\n', key: 'not pem' } };
  assert.throws(() => run(mtls, { target: 'example:443', config: pem, host: new FakeHost({ tls: answer }) }), /neither PEM nor a handle/);

  const elsewhere = probe({
    name: 'elsewhere',
    check() {
      credentials.clientCertificate('10.0.0.1', 443, '$(secret:crt)', '$(secret:key)');
      for (let port = 1; port <= 4; port++) credentials.clientCertificate('10.0.0.2', port, '$(secret:crt)', '$(secret:key)');
      return Outcome.success('');
    },
  });
  assert.throws(() => run(elsewhere, { target: 'example:443', host: new FakeHost({ secrets: ['crt', 'key'] }) }), (e) => e.kind === 'denied');
  const allowNet = ['10.0.0.1:443', ...[1, 2, 3, 4].map((p) => `10.0.0.2:${p}`)];
  assert.throws(() => run(elsewhere, { target: 'example:443', host: new FakeHost({ secrets: ['crt', 'key'], allowNet }) }), /at most 4/);
});

test('the real thing is given secrets as sonde check takes them', () => {
  const check = Plugin.fromFile('p.wasm').check('127.0.0.1:6379').config({ password: '$(secret:pw)' }).secret('pw', '/run/pw');
  assert.deepEqual(check.argv().slice(-4), ['--secret', 'pw=/run/pw', '--output', 'json']);
});
