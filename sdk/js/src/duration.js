// Durations as people write them in a probe's config ('500ms', '1.5s',
// '1m 30s', '2 hours') and back: humantime's grammar, as the Rust SDK's
// `duration` module and the agent's own config use it. Values are seconds.

const S = 1_000_000_000n;
const UNITS = new Map();
for (const [names, nanos] of [
  [['nanos', 'nsec', 'ns'], 1n],
  [['usec', 'us', '\u00b5s'], 1_000n],
  [['millis', 'msec', 'ms'], 1_000_000n],
  [['seconds', 'second', 'secs', 'sec', 's'], S],
  [['minutes', 'minute', 'min', 'mins', 'm'], 60n * S],
  [['hours', 'hour', 'hr', 'hrs', 'h'], 3_600n * S],
  [['days', 'day', 'd'], 86_400n * S],
  [['weeks', 'week', 'wk', 'wks', 'w'], 7n * 86_400n * S],
  [['months', 'month', 'M'], 2_630_016n * S],
  [['years', 'year', 'yr', 'yrs', 'y'], 31_557_600n * S],
]) {
  for (const n of names) UNITS.set(n, nanos);
}

const isDigit = (c) => c >= '0' && c <= '9';
// StarlingMonkey has no Unicode property escapes: the units' letters are ASCII and µ.
const isAlpha = (c) => /[A-Za-z\u00b5]/.test(c);

/** Parses a sum of NUMBER UNIT terms into nanoseconds (a BigInt); throws an Error saying why. */
export function parseNanos(text) {
  let rest = text.trimStart();
  if (!rest) throw new Error('value was empty');
  let total = 0n;
  while (rest) {
    const at = text.length - rest.length;
    let i = 0;
    while (i < rest.length && (isDigit(rest[i]) || rest[i] === '.')) i++;
    const number = rest.slice(0, i);
    let after = rest.slice(i).trimStart();
    if (!number || number.startsWith('.') || number.split('.').length > 2) throw new Error(`expected number at ${at}`);
    let j = 0;
    while (j < after.length && isAlpha(after[j])) j++;
    const unit = after.slice(0, j);
    after = after.slice(j);
    const unitNanos = UNITS.get(unit);
    if (unitNanos === undefined) {
      if (!unit) throw new Error(`time unit needed, for example ${number}sec or ${number}ms`);
      throw new Error(`unknown time unit "${unit}", supported units: ns, us/\u00b5s, ms, sec, min, hours, days, weeks, months, years`);
    }
    const [whole, fraction = ''] = number.split('.');
    let nanos = BigInt(whole) * unitNanos;
    let scale = unitNanos;
    for (const digit of fraction) {
      const part = BigInt(digit) * scale;
      scale /= 10n;
      if (part % 10n !== 0n && scale === 0n) throw new Error('number is too large or below 1ns');
      nanos += part / 10n;
    }
    total += nanos;
    rest = after.trimStart();
    if (rest && !isDigit(rest[0])) throw new Error(`expected number at ${text.length - rest.length}`);
  }
  return total;
}

/** Parses `text` into seconds; throws an Error saying why. */
export function parse(text) {
  return Number(parseNanos(text)) / 1e9;
}

/** As humantime writes a duration of `seconds`: '1h 2m 3s', '2days', '0s'. */
export function format(seconds) {
  let total = BigInt(Math.round(seconds * 1e9));
  if (total <= 0n) return '0s';
  const secs = total / S;
  const nanos = total % S;
  const years = secs / 31_557_600n;
  let rest = secs % 31_557_600n;
  const months = rest / 2_630_016n;
  rest %= 2_630_016n;
  const days = rest / 86_400n;
  rest %= 86_400n;
  const parts = [
    [years, 'year', true], [months, 'month', true], [days, 'day', true],
    [rest / 3_600n, 'h', false], [(rest % 3_600n) / 60n, 'm', false], [rest % 60n, 's', false],
    [nanos / 1_000_000n, 'ms', false], [(nanos / 1_000n) % 1_000n, 'us', false], [nanos % 1_000n, 'ns', false],
  ];
  return parts
    .filter(([v]) => v !== 0n)
    .map(([v, unit, plural]) => `${v}${unit}${plural && v > 1n ? 's' : ''}`)
    .join(' ');
}
