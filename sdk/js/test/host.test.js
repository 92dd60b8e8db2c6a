import { test } from 'node:test';
import assert from 'node:assert/strict';

import { Outcome, NetError, ProbeError, probe, http, tcp, tls, grpc, exec, log, time } from '../src/index.js';
import { FakeHost, FakeSession, respond, run, tlsInfo } from '../src/testing.js';

const decoder = new TextDecoder();

test('outside a component and a test there is no host', () => {
  assert.throws(() => http.get('http://x/'), (e) => e.kind === 'internal' && /no sonde host/.test(e.reason));
  log.info('dropped');
  assert.ok(time.monotonic() > 0);
});

test('http through the fake host: routes, records, keeps headers and caps the body', () => {
  const check = probe({
    name: 't',
    check(req) {
      const r = http.send(new http.HttpRequest({ url: `http://${req.target}/a`, maxBody: 4 }));
      const k = http.sendKeeping(http.HttpRequest.get(`http://${req.target}/a`, 1), ['x-b']);
      log.info('done');
      return Outcome.success(`${r.status} ${r.text()} ${r.header('X-A')} ${k.headers.length} ${k.header('x-b')}`, { metrics: [['t', r.timings.total, 'seconds']] });
    },
  });
  const host = new FakeHost({ http: { 'http://127.0.0.1:1/a': respond(200, 'hello', { headers: [['X-A', '1'], ['x-b', '2']], seconds: 0.2 }) } });
  const o = run(check, { target: '127.0.0.1:1', host });
  assert.equal(o.message, '200 hell 1 1 2');
  assert.equal(o.metric('t'), 0.2);
  assert.equal(host.httpRequests.length, 2);
  assert.deepEqual(host.logs, [['info', 'done']]);
});

test('the fake host refuses what is not the target or granted, as the host does', () => {
  const other = probe({ name: 'o', check: () => { http.get('http://10.0.0.1:80/'); return Outcome.success(''); } });
  assert.throws(() => run(other, { target: '127.0.0.1:1', host: new FakeHost({ http: () => respond(200) }) }), (e) => e instanceof ProbeError && e.kind === 'denied');
  const granted = new FakeHost({ http: () => respond(204), allowNet: ['10.0.0.1:80'] });
  assert.equal(run(other, { target: '127.0.0.1:1', host: granted }).status, 'success');
});

test('a network failure is a NetError (io) unless the check makes it a failure', () => {
  const naive = probe({ name: 'n', check: (req) => Outcome.success(String(http.get(`http://${req.target}/`).status)) });
  assert.throws(() => run(naive, { target: '127.0.0.1:1' }), (e) => e instanceof NetError && e.kind === 'io' && e.failure === 'connect');
  const host = new FakeHost({ http: () => new NetError('timeout', 'no answer in 1s') });
  assert.throws(() => run(naive, { target: '127.0.0.1:1', host }), /timeout: no answer in 1s/);
});

test('tcp sessions send, read until and report timeouts', () => {
  const check = probe({
    name: 'tcp',
    check(req) {
      const [session, connected] = tcp.connect('127.0.0.1', 6379, req.remaining());
      session.send('PING\r\n');
      const { data, error } = session.readUntil(1024, (b) => decoder.decode(b).includes('PONG'));
      const second = session.readUntil(1024, () => false);
      session.close();
      return Outcome.success(`${decoder.decode(data).trim()} ${error} ${second.error?.describe()} ${connected.connectSeconds}`);
    },
  });
  const s = new FakeSession(['+PO', 'NG\r\n'], { hang: true });
  const o = run(check, { target: '127.0.0.1:6379', host: new FakeHost({ tcp: { '127.0.0.1:6379': s } }) });
  assert.equal(o.message, '+PONG undefined timed out 0.001');
  assert.deepEqual(s.sent.map((d) => decoder.decode(d)), ['PING\r\n']);
  assert.ok(s.closed);
});

test('a plain session upgrades with starttls', () => {
  const check = probe({
    name: 'starttls',
    check(req) {
      const [session] = tcp.connect('mail', 25, req.remaining());
      session.send('STARTTLS\r\n');
      session.readUntil(1024, (b) => decoder.decode(b).includes('220'));
      const hs = session.starttls(tls.TlsOptions.fromConfig({ server_name: 'mail.example' }));
      session.send('EHLO x\r\n');
      try {
        session.starttls();
      } catch (e) {
        session.close();
        return Outcome.success(`${hs.info.subject} ${e.message}`);
      }
      return Outcome.failure('upgraded twice');
    },
  });
  const s = new FakeSession(['220 go\r\n'], { tls: tlsInfo({ subject: 'CN=mail' }) });
  const o = run(check, { target: 'mail:25', host: new FakeHost({ tcp: { 'mail:25': s } }) });
  assert.match(o.message, /^CN=mail .*starttls: the session is TLS already$/);
  assert.equal(s.upgraded.serverName, 'mail.example');
  assert.deepEqual(s.sent.map((d) => decoder.decode(d)), ['STARTTLS\r\n', 'EHLO x\r\n']);
  const refused = new FakeSession(['220 go\r\n'], { tls: new NetError('tls', 'certificate not trusted') });
  assert.throws(() => run(check, { target: 'mail:25', host: new FakeHost({ tcp: { 'mail:25': refused } }) }), /not trusted/);
});

test('tls handshakes report the certificate', () => {
  const check = probe({
    name: 'tls',
    check() {
      const hs = tls.handshake('example', 443, tls.TlsOptions.fromConfig({ server_name: 'example' }), 1);
      const days = hs.info.expiresInSeconds() / 86400;
      return days < 14 ? Outcome.warning(`expires in ${Math.round(days)} days`) : Outcome.success(hs.info.subject);
    },
  });
  assert.equal(run(check, { target: 'example:443', host: new FakeHost({ tls: { 'example:443': tlsInfo({ daysLeft: 3 }) } }) }).message, 'expires in 3 days');
  assert.equal(run(check, { target: 'example:443', host: new FakeHost({ tls: () => tlsInfo() }) }).message, 'CN=example');
  assert.throws(() => tls.TlsOptions.fromConfig({ ca_pem: 'x', insecure_skip_verify: true }), /exclude each other/);
  assert.throws(() => tls.TlsOptions.fromConfig({ ca_file: '/x' }), /ca_pem/);
});

test('grpc and exec answers', () => {
  const check = probe({
    name: 'g',
    check(req) {
      const r = grpc.call({ authority: req.target, method: '/grpc.health.v1.Health/Check' });
      const out = exec.run(['/bin/true'], 1);
      return Outcome.success(`${grpc.codeName(r.code)} ${out.exitCode}`);
    },
  });
  const host = new FakeHost({
    grpc: { '/grpc.health.v1.Health/Check': { code: grpc.Code.UNIMPLEMENTED, statusMessage: '', metadata: [] } },
    exec: { '/bin/true': { exitCode: 0, timedOut: false, stdout: new Uint8Array(), stderr: new Uint8Array() } },
  });
  assert.equal(run(check, { target: '127.0.0.1:50051', host }).message, 'UNIMPLEMENTED 0');
  assert.deepEqual(host.execCalls, [['/bin/true']]);
  assert.throws(() => run(check, { target: '127.0.0.1:50051', host: new FakeHost({ grpc: host.grpc }) }), (e) => e.kind === 'denied');
  assert.equal(grpc.codeName(99), 'CODE_99');
});
