// @sonde/sdk: write sonde probe plugins in JavaScript.
//
// A plugin is an ES module built into a WebAssembly component with
// componentize-js against sonde's WIT contract (sdk/wit/probe.wit, world
// `plugin`). The same surface as the Rust SDK: Outcome / Status / Metric /
// ProbeError / Request / Capability, typed config (`config`), `duration`,
// and the host's capabilities in `http`, `tcp`, `tls`, `grpc`, `log`,
// `exec`, `time`, and `credentials` (logins and client certificates from
// secret handles, which the plugin passes and never reads). This module
// imports nothing from the host, so a check defined with it runs under
// node's test runner with `@sonde/sdk/testing`; the component's entry
// module adds `@sonde/sdk/component`.

export { Status, Metric, Outcome, ProbeError, Request, Capability, CapabilityKind } from './core.js';
export { NetError, SessionError } from './net.js';
export { probe, describe, run } from './probe.js';
export * as config from './config.js';
export * as duration from './duration.js';
export * as http from './http.js';
export * as tls from './tls.js';
export * as tcp from './tcp.js';
export * as grpc from './grpc.js';
export * as log from './log.js';
export * as time from './time.js';
export * as exec from './exec.js';
export * as net from './net.js';
export * as credentials from './credentials.js';
