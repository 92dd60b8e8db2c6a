// gRPC through the host (`sonde:probe/grpc`): one unary call. The plugin
// serializes and decodes the messages; the host owns the HTTP/2 connection,
// the framing and the status. A status other than OK is an answer.

import { currentHost } from './host.js';

const NAMES = ['OK', 'CANCELLED', 'UNKNOWN', 'INVALID_ARGUMENT', 'DEADLINE_EXCEEDED', 'NOT_FOUND', 'ALREADY_EXISTS',
  'PERMISSION_DENIED', 'RESOURCE_EXHAUSTED', 'FAILED_PRECONDITION', 'ABORTED', 'OUT_OF_RANGE', 'UNIMPLEMENTED',
  'INTERNAL', 'UNAVAILABLE', 'DATA_LOSS', 'UNAUTHENTICATED'];

export const Code = Object.freeze({ OK: 0, NOT_FOUND: 5, UNIMPLEMENTED: 12, UNAVAILABLE: 14 });

/** A code's name as gRPC spells it ('UNIMPLEMENTED'), or CODE_<n>. */
export function codeName(code) {
  return NAMES[code] ?? `CODE_${code}`;
}

/** A unary call: `method` is '/package.Service/Method'; tls undefined for h2c; timeout in seconds. */
export class GrpcRequest {
  constructor({ authority, method, message = new Uint8Array(0), metadata = [], timeout = 1, tls = undefined }) {
    Object.assign(this, { authority, method, message, metadata, timeout, tls });
  }
}

/**
 * Makes the call: {code, statusMessage, message, metadata, timings, tls}.
 * What kept it from getting a status throws: NetError (target),
 * ProbeError 'denied' / 'invalid-config'.
 */
export function call(req) {
  return currentHost().grpcCall(req instanceof GrpcRequest ? req : new GrpcRequest(req));
}
