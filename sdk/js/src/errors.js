// ProbeError, which every other module may throw: a leaf, importing no other
// module of the SDK.

const KINDS = ['invalid-config', 'denied', 'io', 'internal'];
const LABELS = { 'invalid-config': 'invalid config', io: 'i/o error', internal: 'internal error', denied: 'denied' };

/**
 * Why a check could not produce an Outcome (`types.probe-error`). Throw it
 * when the *check* could not be made; return Outcome.failure when the
 * *target* is unhealthy. The host retries and finally records `unknown`.
 * Kinds: 'invalid-config', 'denied', 'io', 'internal'.
 */
export class ProbeError extends Error {
  constructor(kind, message) {
    if (!KINDS.includes(kind)) throw new TypeError(`probe error kind ${kind}: one of ${KINDS.join(', ')}`);
    super(`${LABELS[kind]}: ${message}`);
    this.name = 'ProbeError';
    this.kind = kind;
    this.reason = String(message);
    // What the component's export returns as its `err` (an own property:
    // the generated bindings take a thrown value's `payload`).
    this.payload = { tag: kind, val: String(message) };
  }
  static invalidConfig(message) {
    return new ProbeError('invalid-config', message);
  }
  static denied(message) {
    return new ProbeError('denied', message);
  }
  static io(message) {
    return new ProbeError('io', message);
  }
  static internal(message) {
    return new ProbeError('internal', message);
  }
}
