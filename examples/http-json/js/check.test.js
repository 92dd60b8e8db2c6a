// Unit tests of the check's logic under node, against the SDK's fake host
// (a unit-test double: no sandbox, no real network). The real component is
// tested by test.sh.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { NetError, ProbeError, describe } from '@sonde/sdk';
import { FakeHost, respond, run } from '@sonde/sdk/testing';

import { httpJson, lookup, jsonEqual } from './check.js';

const URL = 'http://127.0.0.1:8080/health';
const host = (body, { status = 200, seconds = 0.01 } = {}) => new FakeHost({ http: { [URL]: respond(status, body, { seconds }) } });
const check = (config, h) => run(httpJson, { target: '127.0.0.1:8080', config, host: h });

test('the expected value is a success with the response time', () => {
  const o = check({ field: 'status', expected: 'ok' }, host({ status: 'ok' }, { seconds: 0.02 }));
  assert.equal(o.status, 'success', o.message);
  assert.equal(o.metric('response_seconds'), 0.02);
  assert.equal(o.metric('status_code'), 200);
  assert.match(o.message, /status is "ok"/);
});

test('another value is a failure', () => {
  const o = check({ field: 'db.state', expected: 'up' }, host({ db: { state: 'down' } }));
  assert.equal(o.status, 'failure');
  assert.equal(o.message, 'db.state is "down", expected "up"');
});

test('JSON types are compared strictly', () => {
  assert.equal(check({ field: 'ready', expected: 1 }, host({ ready: true })).status, 'failure');
  assert.equal(check({ field: 'items.1', expected: { a: [1] } }, host({ items: [0, { a: [1] }] })).status, 'success');
  assert.ok(jsonEqual({ a: 1, b: 2 }, { b: 2, a: 1 }));
  assert.ok(!jsonEqual([1], { 0: 1 }));
  assert.equal(typeof lookup({ a: 1 }, 'a.b'), 'symbol');
});

test('a slow answer is a warning', () => {
  const o = check({ field: 'status', expected: 'ok', warn_after: '300ms' }, host({ status: 'ok' }, { seconds: 0.5 }));
  assert.equal(o.status, 'warning');
  assert.match(o.message, /over 300ms/);
});

test('a missing field, a bad status and a body that is not JSON fail', () => {
  const cfg = { field: 'status', expected: 'ok' };
  assert.match(check(cfg, host({ state: 'ok' })).message, /no such field/);
  assert.match(check(cfg, host({ status: 'ok' }, { status: 503 })).message, /status 503/);
  assert.match(check(cfg, host('<html>')).message, /not JSON/);
});

test('a refused connection is a failure', () => {
  const o = check({ field: 'status', expected: 'ok' }, new FakeHost({ http: { [URL]: new NetError('connect', 'connection refused') } }));
  assert.equal(o.status, 'failure');
  assert.equal(o.message, `GET ${URL}: connect: connection refused`);
});

test('a URL target is used as it is', () => {
  const h = new FakeHost({ http: { 'http://127.0.0.1:9/x': respond(200, { ok: true }) } });
  const o = run(httpJson, { target: 'http://127.0.0.1:9/x', config: { field: 'ok', expected: true }, host: h });
  assert.equal(o.status, 'success', o.message);
  assert.deepEqual(h.httpRequests[0].headers, [['accept', 'application/json']]);
});

test('config errors name the field', () => {
  const reason = (cfg) => {
    try {
      check(cfg, host({}));
    } catch (e) {
      assert.ok(e instanceof ProbeError && e.kind === 'invalid-config', String(e));
      return e.reason;
    }
    assert.fail(`accepted ${JSON.stringify(cfg)}`);
  };
  assert.equal(reason({ field: 'status' }), 'missing field `expected`');
  assert.match(reason({ field: 's', expected: 1, pth: '/' }), /unknown field `pth`/);
  assert.match(reason({ field: 's', expected: 1, warn_after: 'soon' }), /warn_after/);
});

test('describe publishes the schema', () => {
  const info = describe(httpJson);
  assert.deepEqual([info.name, info.version], ['http-json', '0.1.0']);
  const schema = JSON.parse(info.configSchema);
  assert.deepEqual(schema.required, ['field', 'expected']);
  assert.equal(schema.additionalProperties, false);
  assert.equal(schema.properties.path.default, '/health');
});
