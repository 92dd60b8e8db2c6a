// Typed plugin config: a spec checks the probe's JSON config, fills the
// defaults, and publishes the JSON Schema (draft 2020-12) `describe` gives.
//
//   const Config = config.define({
//     field: config.string({ required: true, description: 'Dotted path of the field.' }),
//     expected: config.any({ required: true }),
//     path: config.string({ default: '/health' }),
//     warn_after: config.duration(),          // '300ms' -> 0.3 (seconds)
//   });
//   const c = req.config();                   // with the probe's `config: Config`
//
// Types: string, integer, number, boolean, any, duration, oneOf([...]),
// list(item), map(item), object({...}). A field is optional (undefined)
// unless `required` or given a `default`. Unknown keys are refused unless
// define(..., { allowUnknown: true }), as the built-in plugins do. Every
// mismatch is ProbeError('invalid-config') naming the field.

import { ProbeError } from './core.js';
import { parse as parseDuration } from './duration.js';

const show = (v) => (JSON.stringify(v) ?? String(v)).slice(0, 60);

function field(kind, opts = {}, extra = {}) {
  return { kind, required: false, ...extra, ...opts };
}

export const string = (opts) => field('string', opts);
export const integer = (opts) => field('integer', opts);
export const number = (opts) => field('number', opts);
export const boolean = (opts) => field('boolean', opts);
export const any = (opts) => field('any', opts);
/** A humantime string ('500ms') read as seconds. */
export const duration = (opts) => field('duration', opts);
export const oneOf = (values, opts) => field('enum', opts, { values });
export const list = (item, opts) => field('list', opts, { item });
export const map = (item, opts) => field('map', opts, { item });
export const object = (fields, opts) => field('object', opts, { fields });

function bad(path, what, v) {
  return ProbeError.invalidConfig(`field \`${path}\`: expected ${what}, got ${show(v)}`);
}

function value(spec, v, path, allowUnknown) {
  switch (spec.kind) {
    case 'any':
      return v;
    case 'string':
      if (typeof v === 'string') return v;
      throw bad(path, 'a string', v);
    case 'boolean':
      if (typeof v === 'boolean') return v;
      throw bad(path, 'a boolean', v);
    case 'integer':
      if (Number.isInteger(v)) return v;
      throw bad(path, 'an integer', v);
    case 'number':
      if (typeof v === 'number') return v;
      throw bad(path, 'a number', v);
    case 'duration':
      if (typeof v !== 'string') throw bad(path, 'a duration such as "500ms"', v);
      try {
        return parseDuration(v);
      } catch (e) {
        throw ProbeError.invalidConfig(`field \`${path}\`: "${v}": ${e.message}`);
      }
    case 'enum':
      if (spec.values.includes(v)) return v;
      throw bad(path, `one of ${spec.values.map(show).join(', ')}`, v);
    case 'list':
      if (!Array.isArray(v)) throw bad(path, 'a list', v);
      return v.map((x, i) => value(spec.item, x, `${path}[${i}]`, allowUnknown));
    case 'map':
      if (!isObject(v)) throw bad(path, 'an object', v);
      return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, value(spec.item, x, `${path}.${k}`, allowUnknown)]));
    case 'object':
      return objectValue(spec.fields, v, path, allowUnknown);
    default:
      throw ProbeError.internal(`field \`${path}\`: config type ${spec.kind} is not supported`);
  }
}

const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);

function objectValue(fields, obj, path, allowUnknown) {
  if (!isObject(obj)) throw ProbeError.invalidConfig(`${path ? `field \`${path}\`` : 'config'}: expected an object`);
  const names = Object.keys(fields);
  if (!allowUnknown) {
    const unknown = Object.keys(obj).filter((k) => !names.includes(k)).sort();
    if (unknown.length) {
      const full = unknown.map((u) => (path ? `${path}.${u}` : u));
      throw ProbeError.invalidConfig(`unknown field \`${full.join('`, `')}\`, expected one of \`${names.join('`, `')}\``);
    }
  }
  const out = {};
  for (const [name, spec] of Object.entries(fields)) {
    const sub = path ? `${path}.${name}` : name;
    if (Object.hasOwn(obj, name)) {
      out[name] = obj[name] === null && !spec.required && spec.kind !== 'any' ? undefined : value(spec, obj[name], sub, allowUnknown);
    } else if (spec.required) {
      throw ProbeError.invalidConfig(`missing field \`${sub}\``);
    } else if ('default' in spec) {
      out[name] = spec.kind === 'duration' && typeof spec.default === 'string' ? parseDuration(spec.default) : structuredCloneish(spec.default);
    } else {
      out[name] = undefined;
    }
  }
  return out;
}

const structuredCloneish = (v) => (v === undefined ? v : JSON.parse(JSON.stringify(v)));

function schemaOf(spec) {
  let s;
  switch (spec.kind) {
    case 'any': s = {}; break;
    case 'duration': s = { type: 'string', description: 'A duration such as "500ms" or "1m 30s".' }; break;
    case 'enum': s = { enum: spec.values }; break;
    case 'list': s = { type: 'array', items: schemaOf(spec.item) }; break;
    case 'map': s = { type: 'object', additionalProperties: schemaOf(spec.item) }; break;
    case 'object': s = objectSchema(spec.fields); break;
    default: s = { type: spec.kind };
  }
  if (spec.description) s.description = spec.description;
  if ('default' in spec && spec.default !== undefined) s.default = spec.default;
  return s;
}

function objectSchema(fields) {
  const properties = Object.fromEntries(Object.entries(fields).map(([n, f]) => [n, schemaOf(f)]));
  const required = Object.entries(fields).filter(([, f]) => f.required).map(([n]) => n);
  return { type: 'object', additionalProperties: false, properties, ...(required.length ? { required } : {}) };
}

/** A config spec: `parse(jsonTextOrObject)` and `schema(title)`. */
export function define(fields, { allowUnknown = false } = {}) {
  return {
    fields,
    parse(config) {
      let obj = config;
      if (typeof config === 'string') {
        try {
          obj = JSON.parse(config || '{}');
        } catch (e) {
          throw ProbeError.invalidConfig(`config is not JSON: ${e.message}`);
        }
      }
      if (!isObject(obj)) throw ProbeError.invalidConfig('config must be a JSON object');
      return objectValue(fields, obj, '', allowUnknown);
    },
    schema(title = '') {
      return JSON.stringify({
        $schema: 'https://json-schema.org/draft/2020-12/schema',
        ...(title ? { title } : {}),
        ...objectSchema(fields),
      });
    },
  };
}
