// The types every check uses: Status, Metric, Outcome, ProbeError, Request,
// PluginInfo, Capability. Nothing here touches the host.

import { monotonic } from './host.js';
import { ProbeError } from './errors.js';

export { ProbeError };

/** The verdict of one check (`types.status` in probe.wit). */
export const Status = Object.freeze({
  SUCCESS: 'success',
  WARNING: 'warning',
  FAILURE: 'failure',
  UNKNOWN: 'unknown',
});

/** One measurement: a Prometheus-style name, a value, a unit ('seconds', 'bytes' or ''). */
export class Metric {
  constructor(name, value, unit = '') {
    this.name = String(name);
    this.value = Number(value);
    this.unit = String(unit);
  }
}

function toMetric(m) {
  if (m instanceof Metric) return m;
  if (Array.isArray(m) && (m.length === 2 || m.length === 3)) return new Metric(m[0], m[1], m[2] ?? '');
  if (m && typeof m === 'object' && 'name' in m && 'value' in m) return new Metric(m.name, m.value, m.unit ?? '');
  throw new TypeError(`a metric is a Metric, {name, value, unit} or [name, value, unit], not ${JSON.stringify(m)}`);
}

/**
 * What a check found: a status, a one-line message, metrics and an optional detail.
 * Build it with Outcome.success(message, {metrics, detail}) (or warning, failure, unknown);
 * metrics are Metric objects, {name, value, unit} or [name, value, unit].
 */
export class Outcome {
  constructor(status, message, { metrics = [], detail = undefined } = {}) {
    if (!Object.values(Status).includes(status)) throw new TypeError(`status ${status}: one of ${Object.values(Status)}`);
    this.status = status;
    this.message = String(message);
    this.metrics = metrics.map(toMetric);
    this.detail = detail;
  }
  /** The target is healthy. */
  static success(message, opts) {
    return new Outcome(Status.SUCCESS, message, opts);
  }
  /** The target works but deserves attention. */
  static warning(message, opts) {
    return new Outcome(Status.WARNING, message, opts);
  }
  /** The target is unhealthy. */
  static failure(message, opts) {
    return new Outcome(Status.FAILURE, message, opts);
  }
  /** The check could not tell. */
  static unknown(message, opts) {
    return new Outcome(Status.UNKNOWN, message, opts);
  }
  /** Adds a metric; returns this. */
  withMetric(name, value, unit = '') {
    this.metrics.push(new Metric(name, value, unit));
    return this;
  }
  /** Sets the detail excerpt; returns this. */
  withDetail(detail) {
    this.detail = String(detail);
    return this;
  }
  /** The value of metric `name`, if reported. */
  metric(name) {
    return this.metrics.find((m) => m.name === name)?.value;
  }
}

/** One call of `check`: the target, the plugin config and the time left (seconds). */
export class Request {
  constructor(target, config = '{}', timeout = 1, { probe = 'test', attempt = 1 } = {}) {
    this.probe = probe;
    this.target = target;
    this.configJson = typeof config === 'string' ? config : JSON.stringify(config ?? {});
    this.timeout = Number(timeout);
    this.attempt = attempt;
    this.started = monotonic();
    this.configSpec = undefined;
  }
  /**
   * The plugin config: checked and typed by `spec` (a config.define(...)),
   * by default the probe's `config`; without one, the parsed JSON object.
   * A mismatch throws ProbeError('invalid-config') naming the field.
   */
  config(spec = this.configSpec) {
    if (spec) return spec.parse(this.configJson);
    let value;
    try {
      value = JSON.parse(this.configJson || '{}');
    } catch (e) {
      throw ProbeError.invalidConfig(`config is not JSON: ${e.message}`);
    }
    if (value === null || typeof value !== 'object' || Array.isArray(value)) {
      throw ProbeError.invalidConfig('config must be a JSON object');
    }
    return value;
  }
  get timeoutMs() {
    return Math.trunc(this.timeout * 1000);
  }
  /** Seconds left before the host stops this call (never below 0). */
  remaining() {
    return Math.max(0, this.timeout - (monotonic() - this.started));
  }
}

/** The kinds of capability a plugin may ask the operator to grant. */
export const CapabilityKind = Object.freeze({ NET: 'net', EXEC: 'exec', FILES: 'files' });

/** A capability a plugin needs, and why. */
export class Capability {
  constructor(kind, value, why) {
    if (!Object.values(CapabilityKind).includes(kind)) throw new TypeError(`capability kind ${kind}`);
    this.kind = kind;
    this.value = value;
    this.why = why;
  }
}
