// Runs Perfetto's trace_processor.wasm (the UI's engine_bundle.js) under Node:
// stdin carries TraceProcessorRpcStream bytes, stdout the framed replies.
const fs = require('fs');
const path = require('path');
const vm = require('vm');
const dir = path.resolve(process.argv[2]);
const bundle = fs.readFileSync(path.join(dir, 'engine_bundle.js'), 'utf8');
function WorkerGlobalScope() {}
const sandbox = {
  console: {log: (...a) => process.stderr.write(a.join(' ') + '\n'), warn: (...a) => process.stderr.write(a.join(' ') + '\n'), error: (...a) => process.stderr.write(a.join(' ') + '\n')},
  WorkerGlobalScope, TextDecoder, TextEncoder, URL, performance, setTimeout, clearTimeout,
  queueMicrotask, Promise, crypto: globalThis.crypto, navigator: {languages: ['en']},
  location: {href: 'file://' + dir + '/engine_bundle.js', protocol: 'file:', host: ''},
  fetch: async (url) => new Response(fs.readFileSync(path.join(dir, path.basename(String(url)))), {headers: {'Content-Type': 'application/wasm'}}),
};
// The wasm is fetched with a synchronous XMLHttpRequest in a worker.
sandbox.XMLHttpRequest = class {
  open(method, url) { this.url = String(url); }
  send() { const b = fs.readFileSync(path.join(dir, path.basename(this.url))); this.response = b.buffer.slice(b.byteOffset, b.byteOffset + b.length); this.status = 200; }
};
sandbox.self = sandbox;
vm.createContext(sandbox);
vm.runInContext(bundle, sandbox, {filename: 'engine_bundle.js'});
const port = {postMessage: (bytes) => { process.stdout.write(Buffer.from(bytes)); }};
sandbox.onmessage({data: port});
// The wasm bridge asserts Uint8Array from its own realm.
const U8 = vm.runInContext('Uint8Array', sandbox);
let ready = false; const queue = [];
function feed(chunk) { port.onmessage({data: new U8(chunk)}); }
process.stdin.on('data', (c) => { if (ready) feed(c); else queue.push(c); });
process.stdin.on('end', () => process.exit(0));
(function wait() {
  // trace_processor_rpc_init runs once the wasm is instantiated.
  try { feed(Buffer.alloc(0)); } catch (e) { return setTimeout(wait, 20); }
  ready = true; for (const c of queue) feed(c);
})();
