// Runs a wasm32-wasip1 command module under Node's WASI (used by wasm.sh). The filter
// crate's proxy-wasm imports are linked in but never called by the bench: stubbed.
const { WASI } = require('node:wasi');
const fs = require('fs');
const [file, ...args] = process.argv.slice(2);
const wasi = new WASI({ version: 'preview1', args: ['bench-hotpath', ...args], env: {} });
const wasm = new WebAssembly.Module(fs.readFileSync(file));
const imports = wasi.getImportObject();
imports.env = {};
for (const i of WebAssembly.Module.imports(wasm)) if (i.module === 'env') imports.env[i.name] = () => 0;
const instance = new WebAssembly.Instance(wasm, imports);
// The proxy-wasm SDK also exports _initialize, which WASI.start refuses next to _start.
wasi.start({ exports: { _start: instance.exports._start, memory: instance.exports.memory } });
