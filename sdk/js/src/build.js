// Building a component: rolldown bundles the entry module and the SDK into
// one ES module (componentize-js takes one), leaving the host's `sonde:` and
// `wasi:` imports as they are; componentize-js then binds them from the WIT
// of this sonde checkout (sdk/wit, never a copy) and snapshots the module
// into a component. Nothing generated is written into the source tree.
//
//   npx sonde-js-build app.js -o http-json.wasm

import { writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { dirname, resolve, join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const WORLD = 'plugin';

/** $SONDE_WIT, else the sdk/wit of the checkout this package sits in. */
export function witDir() {
  if (process.env.SONDE_WIT) return resolve(process.env.SONDE_WIT);
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (existsSync(join(dir, 'wit', 'probe.wit'))) return join(dir, 'wit');
    const parent = dirname(dir);
    if (parent === dir) {
      throw new Error('cannot find sdk/wit/probe.wit above @sonde/sdk; set SONDE_WIT to the sdk/wit directory of a sonde checkout');
    }
    dir = parent;
  }
}

/** The entry module and everything it imports, as one ES module's text. */
export async function bundle(entry) {
  const { rolldown } = await import('rolldown');
  const sdkSrc = dirname(fileURLToPath(import.meta.url));
  const build = await rolldown({
    input: resolve(entry),
    external: [/^sonde:/, /^wasi:/],
    platform: 'neutral',
    logLevel: 'warn',
    resolve: {
      // The example and the scaffold import '@sonde/sdk' without installing
      // it from a registry: resolve it to this package.
      alias: {
        '@sonde/sdk/component': join(sdkSrc, 'component.js'),
        '@sonde/sdk': join(sdkSrc, 'index.js'),
      },
    },
  });
  try {
    const { output } = await build.generate({ format: 'esm', codeSplitting: false });
    return output[0].code;
  } finally {
    await build.close();
  }
}

/** Builds `entry` into the component `out`; returns {seconds, bytes}. */
export async function componentize(entry, out, { wit = witDir(), debugBindingsDir = undefined } = {}) {
  const start = performance.now();
  const source = await bundle(entry);
  const { componentize: cjs } = await import('@bytecodealliance/componentize-js');
  const { component } = await cjs(source, {
    sourceName: 'app.js',
    witPath: wit,
    worldName: WORLD,
    // The host's own http (sonde:probe/http) is the way out; wasi:http and
    // the fetch event are not needed (fewer imports, a smaller component).
    disableFeatures: ['http', 'fetch-event'],
    ...(debugBindingsDir ? { debugBindings: true, debug: { bindings: true, bindingsDir: debugBindingsDir } } : {}),
  });
  await writeFile(out, component);
  return { seconds: (performance.now() - start) / 1000, bytes: component.length };
}

