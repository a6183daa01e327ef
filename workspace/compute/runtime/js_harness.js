'use strict';
// Runs one JavaScript Function inside the sandbox. Reads job.json ({entry, args}) and the
// user's code from main.js, calls the entry function with the positional arguments (awaiting
// a returned promise) and writes one JSON document to the result fd.
const fs = require('fs');
const path = require('path');

const fd = Number(process.env.CHAINSTATE_RESULT_FD);
delete process.env.CHAINSTATE_RESULT_FD;

function emit(doc) {
  fs.writeSync(fd, JSON.stringify(doc));
  fs.closeSync(fd);
}

function failure(code, err) {
  const isErr = err instanceof Error;
  return {
    ok: false,
    code,
    type: isErr ? err.name : typeof err,
    message: isErr ? `${err.name}: ${err.message}` : `thrown value: ${String(err)}`,
    stack: isErr && err.stack ? String(err.stack) : '',
    locals: {},
  };
}

async function main() {
  const job = JSON.parse(fs.readFileSync('job.json', 'utf8'));
  const entry = job.entry;
  const file = path.resolve('main.js');
  const source = fs.readFileSync(file, 'utf8');
  const tail = `\n;module.exports.__chainstateEntry = (typeof ${entry} !== 'undefined') ? ${entry} : module.exports[${JSON.stringify(entry)}];\n`;
  fs.writeFileSync(file, source + tail);
  let mod;
  try {
    mod = require(file);
  } catch (err) {
    emit(failure(err instanceof SyntaxError ? 'compile_error' : 'exception', err));
    return;
  }
  const func = mod.__chainstateEntry;
  if (typeof func !== 'function') {
    emit({ ok: false, code: 'entry_not_found', type: 'ReferenceError',
      message: `entry function '${entry}' is not defined`, stack: '', locals: {} });
    return;
  }
  let value;
  try {
    value = await func(...job.args);
  } catch (err) {
    const oom = err instanceof RangeError && /allocation|memory|Array buffer/i.test(err.message);
    emit(failure(oom ? 'memory_limit' : 'exception', err));
    return;
  }
  let encoded;
  try {
    encoded = JSON.stringify(value === undefined ? null : value);
  } catch (err) {
    emit({ ok: false, code: 'bad_return', type: err.name,
      message: `return value is not JSON: ${err.message}`, stack: '', locals: {} });
    return;
  }
  if (encoded === undefined) {
    emit({ ok: false, code: 'bad_return', type: 'TypeError',
      message: `return value is not JSON: ${typeof value}`, stack: '', locals: {} });
    return;
  }
  fs.writeSync(fd, `{"ok":true,"value":${encoded}}`);
  fs.closeSync(fd);
}

main().then(() => process.exit(0), (err) => {
  try { emit(failure('exception', err)); } finally { process.exit(0); }
});
