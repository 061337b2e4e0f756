"""LLVM IR text -> native object code, in this process or in a helper process.

`compile_object(source, cpu, features, opt_level)` parses, verifies and optimizes one module (the O3
pipeline with loop and SLP vectorization) and emits a relocatable object for that CPU. cpu.py loads
such objects into its JIT.

llvmlite serializes every call behind one lock, so threads cannot compile modules side by side; this
file also runs as a helper process (`python llvm_worker.py`, started by cpu.CompileWorkers) that
compiles modules sent over its stdin: one request at a time, each a length-prefixed pickle of
([source, ...], cpu, features, opt_level), answered on stdout with ("ok", [object bytes, ...]) or
("error", message).
It imports nothing but llvmlite and the standard library, so it starts in a fraction of a second, and
it exits when its stdin closes (its parent ended or dropped it).
"""
from __future__ import annotations
import functools
import pickle
import struct
import sys
import llvmlite.binding as llvm

_HEADER = struct.Struct("<Q")


@functools.cache
def _init() -> None:
  llvm.initialize_native_target()
  llvm.initialize_native_asmprinter()


def target_machine(cpu: str, features: str):
  _init()
  target = llvm.Target.from_default_triple()
  return target.create_target_machine(cpu=cpu, features=features, opt=3, reloc="default", codemodel="jitdefault")


def optimize(mod, tm, level: int = 3) -> None:
  pto = llvm.create_pipeline_tuning_options(speed_level=level)
  pto.loop_vectorization = level >= 2
  pto.slp_vectorization = level >= 2
  pb = llvm.create_pass_builder(tm, pto)
  pb.getModulePassManager().run(mod, pb)


def compile_module(source: str, cpu: str, features: str, opt_level: int):
  """-> (object bytes, the optimized module)."""
  tm = target_machine(cpu, features)
  mod = llvm.parse_assembly(source)
  mod.verify()
  if opt_level: optimize(mod, tm, opt_level)
  return tm.emit_object(mod), mod


def compile_object(source: str, cpu: str, features: str, opt_level: int) -> bytes:
  return compile_module(source, cpu, features, opt_level)[0]


def write_message(stream, obj) -> None:
  data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
  stream.write(_HEADER.pack(len(data)) + data)
  stream.flush()


def read_message(stream):
  """The next message, or None at end of stream."""
  header = stream.read(_HEADER.size)
  if len(header) < _HEADER.size: return None
  (n,) = _HEADER.unpack(header)
  data = stream.read(n)
  if len(data) < n: return None
  return pickle.loads(data)


def serve(inp, out) -> None:
  while (request := read_message(inp)) is not None:
    sources, cpu, features, opt_level = request
    try: reply = ("ok", [compile_object(src, cpu, features, opt_level) for src in sources])
    except Exception as e: reply = ("error", f"{type(e).__name__}: {e}")
    write_message(out, reply)


if __name__ == "__main__":
  serve(sys.stdin.buffer, sys.stdout.buffer)
