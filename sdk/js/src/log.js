// Logging into the host's log (`sonde:probe/log`), tagged with the probe's name.
import { currentHost } from './host.js';

export const trace = (message) => currentHost().log('trace', String(message));
export const debug = (message) => currentHost().log('debug', String(message));
export const info = (message) => currentHost().log('info', String(message));
export const warn = (message) => currentHost().log('warn', String(message));
export const error = (message) => currentHost().log('error', String(message));
