import { test } from 'node:test';
import assert from 'node:assert/strict';

import { Outcome, ProbeError, Request, Status, Metric, describe, probe, run, config, duration, net } from '../src/index.js';

test('outcomes carry a status, metrics in three spellings and a detail', () => {
  const o = Outcome.warning('slow', { metrics: [new Metric('a', 1, 'seconds'), ['b', 2], { name: 'c', value: 3, unit: 'bytes' }], detail: 'x' });
  assert.equal(o.status, Status.WARNING);
  assert.deepEqual(o.metrics.map((m) => [m.name, m.value, m.unit]), [['a', 1, 'seconds'], ['b', 2, ''], ['c', 3, 'bytes']]);
  assert.equal(o.withMetric('d', 4).metric('d'), 4);
  assert.equal(Outcome.success('up').detail, undefined);
  assert.throws(() => new Outcome('fine', 'x'), TypeError);
});

test('probe errors carry the payload the component returns', () => {
  const e = ProbeError.invalidConfig('bad');
  assert.equal(e.kind, 'invalid-config');
  assert.equal(e.message, 'invalid config: bad');
  assert.deepEqual(e.payload, { tag: 'invalid-config', val: 'bad' });
  assert.ok(Object.hasOwn(e, 'payload'), 'the generated bindings read an own payload');
  assert.throws(() => new ProbeError('oops', 'x'), TypeError);
});

test('a request gives the config as JSON, typed, or refuses it', () => {
  const req = new Request('h:1', '{"a": 1}', 2);
  assert.deepEqual(req.config(), { a: 1 });
  assert.ok(req.remaining() <= 2 && req.remaining() > 1.5);
  assert.equal(req.timeoutMs, 2000);
  assert.throws(() => new Request('h:1', '[1]').config(), /config must be a JSON object/);
  assert.throws(() => new Request('h:1', '{').config(), (e) => e.kind === 'invalid-config');
});

const Cfg = config.define({
  name: config.string({ required: true, description: 'who' }),
  count: config.integer({ default: 3 }),
  ratio: config.number(),
  on: config.boolean({ default: false }),
  wait: config.duration({ default: '1s' }),
  mode: config.oneOf(['a', 'b']),
  tags: config.list(config.string()),
  labels: config.map(config.string()),
  inner: config.object({ x: config.integer({ required: true }) }),
});

test('typed config: defaults, types, durations and nested objects', () => {
  const c = Cfg.parse('{"name": "n", "ratio": 1, "mode": "b", "tags": ["t"], "labels": {"k": "v"}, "inner": {"x": 2}, "wait": "1m 30s"}');
  assert.deepEqual(c, { name: 'n', count: 3, ratio: 1, on: false, wait: 90, mode: 'b', tags: ['t'], labels: { k: 'v' }, inner: { x: 2 } });
  assert.equal(Cfg.parse({ name: 'n' }).wait, 1);
  assert.equal(Cfg.parse({ name: 'n' }).ratio, undefined);
});

test('typed config errors name the field', () => {
  const msg = (cfg) => {
    try {
      Cfg.parse(cfg);
    } catch (e) {
      assert.equal(e.kind, 'invalid-config');
      return e.reason;
    }
    assert.fail('accepted');
  };
  assert.equal(msg({}), 'missing field `name`');
  assert.match(msg({ name: 'n', nme: 1 }), /^unknown field `nme`, expected one of `name`, `count`/);
  assert.equal(msg({ name: 'n', count: 1.5 }), 'field `count`: expected an integer, got 1.5');
  assert.match(msg({ name: 'n', wait: 'soon' }), /field `wait`: "soon": unknown time unit|expected number/);
  assert.match(msg({ name: 'n', mode: 'c' }), /expected one of "a", "b"/);
  assert.equal(msg({ name: 'n', tags: [1] }), 'field `tags[0]`: expected a string, got 1');
  assert.match(msg({ name: 'n', inner: { x: 1, y: 2 } }), /unknown field `inner.y`/);
  assert.equal(config.define({ a: config.any() }, { allowUnknown: true }).parse({ b: 1 }).a, undefined);
});

test('the schema is JSON Schema 2020-12 with required fields, defaults and descriptions', () => {
  const s = JSON.parse(Cfg.schema('t'));
  assert.equal(s.$schema, 'https://json-schema.org/draft/2020-12/schema');
  assert.equal(s.title, 't');
  assert.deepEqual(s.required, ['name']);
  assert.equal(s.additionalProperties, false);
  assert.deepEqual(s.properties.name, { type: 'string', description: 'who' });
  assert.equal(s.properties.count.default, 3);
  assert.deepEqual(s.properties.inner.required, ['x']);
});

test('durations parse and format as humantime does', () => {
  for (const [text, secs] of [['500ms', 0.5], ['1.5s', 1.5], ['1m 30s', 90], ['1m30s', 90], ['2 hours', 7200], ['1d', 86400], ['250us', 0.00025], ['7\u00b5s', 0.000007], ['  2s ', 2]]) {
    assert.equal(duration.parse(text), secs, text);
  }
  for (const [text, why] of [['', 'value was empty'], ['500', 'time unit needed'], ['5 parsecs', 'unknown time unit'], ['ms', 'expected number at 0'], ['1s x', 'expected number at 3'], ['0.5ns', 'below 1ns']]) {
    assert.throws(() => duration.parse(text), new RegExp(why), text);
  }
  for (const text of ['5m', '1h 30m', '2days', '1year 2months 3days', '1s 500ms']) assert.equal(duration.format(duration.parse(text)), text);
  assert.equal(duration.format(0), '0s');
});

test('hostPort splits host:port and refuses the rest', () => {
  assert.deepEqual(net.hostPort('db:5432'), ['db', 5432]);
  assert.deepEqual(net.hostPort('[::1]:80'), ['::1', 80]);
  for (const bad of ['db', ':80', 'db:x', 'db:70000']) assert.throws(() => net.hostPort(bad), (e) => e.kind === 'invalid-config', bad);
});

test('run turns a bug into an internal error and checks what came back', () => {
  const boom = probe({ name: 'boom', check: () => null.x });
  assert.throws(() => run(boom, new Request('t')), (e) => e.kind === 'internal' && /TypeError/.test(e.reason));
  const wrong = probe({ name: 'wrong', check: () => 'fine' });
  assert.throws(() => run(wrong, new Request('t')), /not an Outcome/);
  const asyncCheck = probe({ name: 'async', check: async () => Outcome.success('x') });
  assert.throws(() => run(asyncCheck, new Request('t')), /synchronous/);
  const refusing = probe({ name: 'refusing', check: () => { throw ProbeError.denied('no'); } });
  assert.throws(() => run(refusing, new Request('t')), (e) => e.kind === 'denied');
});

test('describe publishes the config schema', () => {
  const p = probe({ name: 'p', vendor: 'v', config: Cfg, check: () => Outcome.success('x') });
  const info = describe(p);
  assert.equal(info.name, 'p');
  assert.equal(info.version, '0.1.0');
  assert.equal(JSON.parse(info.configSchema).title, 'p');
  assert.equal(describe(probe({ name: 'q', check: () => Outcome.success('') })).configSchema, undefined);
});
