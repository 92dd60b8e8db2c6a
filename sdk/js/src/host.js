// The host behind the helpers: the component's imports (probe.wit) inside a
// component (installed by `@sonde/sdk/component`), a FakeHost under
// `@sonde/sdk/testing`, nothing otherwise. Every helper calls the current
// backend with the SDK's own types, so a check's code is the same in the
// sandbox and in a unit test.

import { ProbeError } from './errors.js';

const noHost = new Proxy(
  {
    log() {},
    monotonic: () => (globalThis.performance?.now?.() ?? Date.now()) / 1000,
    unixSeconds: () => Date.now() / 1000,
  },
  {
    get(target, name) {
      if (name in target) return target[name];
      return () => {
        throw ProbeError.internal(
          `no sonde host for ${String(name)}: build the check into a component (@sonde/sdk/component), ` +
            'or run it under @sonde/sdk/testing with a FakeHost',
        );
      };
    },
  },
);

let backend = null;

/** The backend in use. */
export function currentHost() {
  return backend ?? noHost;
}

/** Makes `b` the host (null: none); returns the previous one. */
export function installHost(b) {
  const previous = backend;
  backend = b;
  return previous;
}

export const monotonic = () => currentHost().monotonic();
export const unixSeconds = () => currentHost().unixSeconds();
